package transport

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// tcpConns returns the two ends of a loopback TCP connection.
func tcpConns(t testing.TB) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed := make(chan net.Conn, 1)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Error(err)
		}
		dialed <- c
	}()
	a, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	b = <-dialed
	if b == nil {
		t.FailNow()
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// tcpTestLink returns a data TCPLink to rank 1 over one end of a loopback
// connection, whose first bytes, lead, come through a handshake's
// bufio.Reader, and the raw other end to write the stream with.
func tcpTestLink(t testing.TB, c *Ctl, lead []byte) (*TCPLink, net.Conn) {
	t.Helper()
	srv, cli := tcpConns(t)
	var br *bufio.Reader
	if len(lead) > 0 {
		if _, err := cli.Write(lead); err != nil {
			t.Fatal(err)
		}
		br = bufio.NewReader(srv)
		if _, err := br.Peek(len(lead)); err != nil {
			t.Fatal(err)
		}
	}
	l := NewTCPLink(1, srv, br, c, true)
	t.Cleanup(func() { c.Halt(); l.Close() })
	return l, cli
}

// wireMsg is one message of a test stream.
type wireMsg struct {
	h       Header
	payload []byte
}

func (m wireMsg) bytes() []byte {
	b := make([]byte, HeaderSize+len(m.payload))
	m.h.encode(b)
	copy(b[HeaderSize:], m.payload)
	return b
}

// testStream is a sequence of data messages of many sizes (empty, tiny,
// at the small/big boundary, several MiB) with wake-ups, acks and notices
// between them; every payload byte is distinct per message.
func testStream() (msgs []wireMsg, data []wireMsg, notices [][]byte) {
	sizes := []int{0, 4, 60, 64, 100, 4096, 5000, 60000, tcpSmallMax, tcpSmallMax + 4, 300 << 10, 3<<20 + 12, 8, 16 << 10, 1 << 20, 4}
	for i, n := range sizes {
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(i*31 + j*7 + j>>8)
		}
		m := wireMsg{h: Header{Kind: kindColl, Sender: 1, FP: comm.Fingerprint{Seq: uint64(i + 1), Op: comm.OpAllReduce, DType: comm.Int32, Count: int64(n / 4), Shape: comm.ShapeKey(i)}, Step: uint32(i), Len: uint64(n)}, payload: p}
		if i%3 == 2 {
			m.h.Kind, m.h.FP.Shape, m.h.Tag = kindP2P, 0, int64(i)
		}
		msgs = append(msgs, m)
		data = append(data, m)
		switch i % 4 {
		case 1:
			msgs = append(msgs, wireMsg{h: Header{Kind: kindWake, FP: comm.Fingerprint{Op: comm.OpBarrier}}})
		case 2:
			msgs = append(msgs, wireMsg{h: Header{Kind: kindAck, FP: comm.Fingerprint{Op: comm.OpBarrier}}})
		case 3:
			np := []byte(fmt.Sprintf(`{"notice":%d}`, i))
			notices = append(notices, np)
			msgs = append(msgs, wireMsg{h: Header{Kind: kindNotice, FP: comm.Fingerprint{Op: comm.OpBarrier}, Len: uint64(len(np))}, payload: np})
		}
	}
	return msgs, data, notices
}

// writeChopped writes b to c in random pieces (splitting headers and
// payloads anywhere), pausing now and then so that the reader sees
// partial messages.
func writeChopped(c net.Conn, b []byte, seed int64) error {
	rng := rand.New(rand.NewSource(seed))
	for len(b) > 0 {
		n := 1 + rng.Intn(200)
		switch rng.Intn(4) {
		case 0:
			n = 1 + rng.Intn(HeaderSize)
		case 1:
			n = 1 + rng.Intn(70000)
		}
		n = min(n, len(b))
		if _, err := c.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
		if rng.Intn(8) == 0 {
			time.Sleep(time.Duration(rng.Intn(300)) * time.Microsecond)
		}
	}
	return nil
}

// pollWait polls l until a message arrives, as the progress goroutine
// does: eagerly (reading the socket itself), or lazily, sleeping between
// polls so that the reader goroutine takes the bytes off the socket.
func pollWait(t *testing.T, l *TCPLink, lazy bool) Header {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		h, ok, err := l.poll()
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		if ok {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatal("no message within 20 s")
		}
		if lazy {
			time.Sleep(200 * time.Microsecond)
		} else {
			runtime.Gosched()
		}
	}
}

// TestTCPLinkStream: every message of a stream written in random pieces
// arrives whole and in order, through copy, reduce and segment sinks,
// whether the progress goroutine reads the socket itself (eager) or
// leaves it to the reader goroutine (lazy), and whatever the handshake's
// reader had already buffered; notices, acks and wake-ups are handled on
// the way.
func TestTCPLinkStream(t *testing.T) {
	msgs, data, notices := testStream()
	var stream []byte
	for _, m := range msgs {
		stream = append(stream, m.bytes()...)
	}
	for _, tc := range []struct {
		name string
		lazy bool
		lead int
	}{{"eager", false, 0}, {"lazy", true, 0}, {"eager-lead", false, HeaderSize + 30}, {"lazy-lead", true, 3*HeaderSize + 70}} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCtl()
			var mu sync.Mutex
			var gotNotices [][]byte
			acks := 0
			c.OnNotice = func(peer int, payload []byte, ack func()) {
				mu.Lock()
				defer mu.Unlock()
				if peer != 1 {
					t.Errorf("notice from %d, want 1", peer)
				}
				gotNotices = append(gotNotices, append([]byte(nil), payload...))
			}
			c.OnAck = func(int) { mu.Lock(); acks++; mu.Unlock() }
			l, w := tcpTestLink(t, c, stream[:tc.lead])
			werr := make(chan error, 1)
			go func() { werr <- writeChopped(w, stream[tc.lead:], int64(len(tc.name))) }()
			for i, want := range data {
				h := pollWait(t, l, tc.lazy)
				if h != want.h {
					t.Fatalf("message %d: header %+v, want %+v", i, h, want.h)
				}
				got := make([]byte, len(want.payload))
				var s sink
				switch i % 3 {
				case 0:
					s = sink{dst: got}
				case 1:
					s = sink{dst: got, reduce: true, dt: comm.Int32, red: comm.Sum.ForDType(comm.Int32)}
				case 2:
					next := 0
					s = sink{fn: func(off int, seg []byte) error {
						if off != next || off+len(seg) > len(got) {
							return fmt.Errorf("segment at %d of %d bytes, want at %d", off, len(seg), next)
						}
						next += copy(got[off:], seg)
						return nil
					}}
				}
				if err := l.read(&h, s); err != nil {
					t.Fatalf("message %d: read: %v", i, err)
				}
				if !bytes.Equal(got, want.payload) {
					t.Fatalf("message %d (%d bytes): payload differs", i, len(got))
				}
			}
			if err := <-werr; err != nil {
				t.Fatal(err)
			}
			// The control messages after the last data message.
			deadline := time.Now().Add(10 * time.Second)
			for {
				mu.Lock()
				n, a := len(gotNotices), acks
				mu.Unlock()
				if n == len(notices) && a == 4 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d notices and %d acks, want %d and 4", n, a, len(notices))
				}
				l.poll()
				time.Sleep(time.Millisecond)
			}
			for i := range notices {
				if !bytes.Equal(gotNotices[i], notices[i]) {
					t.Errorf("notice %d: %q, want %q", i, gotNotices[i], notices[i])
				}
			}
		})
	}
}

// TestTCPLinkPollReadsSocket: poll takes a message off the socket itself,
// without the link's reader goroutine. With GOMAXPROCS=1 and a polling
// loop that never yields, the reader goroutine cannot run, so a poll that
// only looked at what the reader handed over would find nothing.
func TestTCPLinkPollReadsSocket(t *testing.T) {
	c := NewCtl()
	l, w := tcpTestLink(t, c, nil)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	// The reader goroutine parks in the network poller. A Gosched alone
	// sometimes left it short of its blocking read, holding the link's
	// lock that poll's direct read tries (message 0 then failed: 3 in
	// 6,000 runs, at 832f142 too); a sleep hands it the P until it blocks.
	runtime.Gosched()
	time.Sleep(time.Millisecond)
	for i := range 20 {
		m := wireMsg{h: Header{Kind: kindColl, Sender: 1, FP: comm.Fingerprint{Seq: uint64(i + 1), Op: comm.OpAllReduce}, Len: 8}, payload: []byte("8 bytes!")}
		if _, err := w.Write(m.bytes()); err != nil {
			t.Fatal(err)
		}
		ok := false
		var h Header
		for range 1000 { // a few ms at most: below the 10 ms of async preemption
			var err error
			if h, ok, err = l.poll(); err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
		}
		if !ok {
			t.Fatalf("message %d: 1000 polls without yielding found nothing", i)
		}
		got := make([]byte, 8)
		if err := l.read(&h, sink{dst: got}); err != nil || h.FP.Seq != uint64(i+1) || string(got) != "8 bytes!" {
			t.Fatalf("message %d: %+v %q %v", i, h, got, err)
		}
	}
}

// TestTCPLinkBackpressure: a peer that sends more messages than the link
// queues (tcpInbox) before the progress goroutine polls loses none: the
// reader stops taking bytes off the socket while the queue is full and
// goes on once poll drains it.
func TestTCPLinkBackpressure(t *testing.T) {
	c := NewCtl()
	l, w := tcpTestLink(t, c, nil)
	const n = 5 * tcpInbox
	go func() {
		for i := range n {
			m := wireMsg{h: Header{Kind: kindColl, Sender: 1, FP: comm.Fingerprint{Seq: uint64(i + 1), Op: comm.OpAllReduce}, Len: 1000}, payload: bytes.Repeat([]byte{byte(i)}, 1000)}
			if _, err := w.Write(m.bytes()); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond) // the reader fills the queue and waits
	for i := range n {
		h := pollWait(t, l, i%2 == 0)
		got := make([]byte, 1000)
		if err := l.read(&h, sink{dst: got}); err != nil {
			t.Fatal(err)
		}
		if h.FP.Seq != uint64(i+1) || got[0] != byte(i) || got[999] != byte(i) {
			t.Fatalf("message %d: seq %d, payload %d..%d", i, h.FP.Seq, got[0], got[999])
		}
	}
}

// TestTCPLinkPeerGone: a peer that closes its end, after a whole message
// or in the middle of one, is an error of poll (eager or lazy) or of read
// naming the peer, after the messages that arrived whole.
func TestTCPLinkPeerGone(t *testing.T) {
	whole := wireMsg{h: Header{Kind: kindColl, Sender: 1, FP: comm.Fingerprint{Seq: 1, Op: comm.OpAllReduce}, Len: 4}, payload: []byte("abcd")}
	big := wireMsg{h: Header{Kind: kindColl, Sender: 1, FP: comm.Fingerprint{Seq: 2, Op: comm.OpAllReduce}, Len: 1 << 20}, payload: make([]byte, 1<<20)}
	for _, tc := range []struct {
		name string
		tail []byte // written after the whole message, before closing
		lazy bool
	}{
		{"eof-eager", nil, false}, {"eof-lazy", nil, true},
		{"mid-header", big.bytes()[:20], false},
		{"mid-small-payload", (wireMsg{h: Header{Kind: kindColl, Sender: 1, FP: comm.Fingerprint{Seq: 2, Op: comm.OpAllReduce}, Len: 100}, payload: make([]byte, 100)}).bytes()[:HeaderSize+10], true},
		{"mid-big-payload", big.bytes()[:HeaderSize+1000], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCtl()
			l, w := tcpTestLink(t, c, nil)
			if _, err := w.Write(append(whole.bytes(), tc.tail...)); err != nil {
				t.Fatal(err)
			}
			w.Close()
			h := pollWait(t, l, tc.lazy)
			got := make([]byte, 4)
			if err := l.read(&h, sink{dst: got}); err != nil || string(got) != "abcd" {
				t.Fatalf("the whole message: %q, %v", got, err)
			}
			var err error
			deadline := time.Now().Add(10 * time.Second)
			for err == nil && time.Now().Before(deadline) {
				var ok bool
				h, ok, err = l.poll()
				if ok {
					// the big message's header: its payload is cut short
					err = l.read(&h, sink{dst: make([]byte, h.Len)})
					if err == nil {
						t.Fatal("a payload cut short was read whole")
					}
				}
				if tc.lazy {
					time.Sleep(time.Millisecond)
				}
			}
			if err == nil || !strings.Contains(err.Error(), "rank 1") || !(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
				t.Fatalf("error %v, want an EOF from rank 1", err)
			}
		})
	}
}

// TestTCPLinkControlOnlyRejectsData: a control-only link (the TCP side of
// an shm pair) that receives a data message fails with a protocol error.
func TestTCPLinkControlOnlyRejectsData(t *testing.T) {
	c := NewCtl()
	srv, cli := tcpConns(t)
	l := NewTCPLink(1, srv, nil, c, false)
	defer func() { c.Halt(); l.Close() }()
	m := wireMsg{h: Header{Kind: kindColl, Sender: 1, FP: comm.Fingerprint{Seq: 1, Op: comm.OpAllReduce}, Len: 4}, payload: []byte("abcd")}
	if _, err := cli.Write(m.bytes()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.dead:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not stop")
	}
	if err := l.readErr(); err == nil || !strings.Contains(err.Error(), "control-only") {
		t.Fatalf("error %v, want a control-only protocol error", err)
	}
}

// BenchmarkTCPLinkPingPong measures a round trip of a message between two
// TCP links of this process, each side polling as the progress goroutine
// does (ns/op is one round trip). Run it with -cpu 1, as rankrunner runs
// a rank: with more Ps than free CPUs both sides spin at once and the
// figure measures the machine's scheduler instead.
func BenchmarkTCPLinkPingPong(b *testing.B) {
	for _, n := range []int{4, 4 << 10, 64 << 10} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ca, cb := NewCtl(), NewCtl()
			x, y := tcpConns(b)
			la, lb := NewTCPLink(1, x, nil, ca, true), NewTCPLink(0, y, nil, cb, true)
			defer func() { ca.Halt(); cb.Halt(); la.Close(); lb.Close() }()
			payload, got := make([]byte, n), make([]byte, n)
			h := Header{Kind: kindColl, FP: comm.Fingerprint{Op: comm.OpAllReduce}, Len: uint64(n)}
			recv := func(l *TCPLink) error {
				for {
					rh, ok, err := l.poll()
					if err != nil {
						return err
					}
					if ok {
						return l.read(&rh, sink{dst: got})
					}
					runtime.Gosched()
				}
			}
			done := make(chan error, 1)
			go func() {
				for {
					if err := recv(lb); err != nil {
						done <- err
						return
					}
					if err := lb.send(&h, payload); err != nil {
						done <- err
						return
					}
				}
			}()
			b.SetBytes(int64(2 * n))
			for b.Loop() {
				if err := la.send(&h, payload); err != nil {
					b.Fatal(err)
				}
				if err := recv(la); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
