package cpu

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/transport"
)

// Store keys (under the job's store): the per-job secret, and per group
// and epoch one entry per rank with its address and host id.
const secretKey = "secret"

func (e *Engine) rankKey(r int) string {
	return fmt.Sprintf("cpu/%s/%d/rank/%d", e.cfg.Group, e.cfg.Epoch, r)
}

// peerInfo is what a rank publishes for its peers.
type peerInfo struct {
	Addr string `json:"addr"`
	Host string `json:"host"`
	PID  int    `json:"pid"`
	// CPUs is the rank's CPU affinity, for the wait policy (transport/shm_group.go).
	CPUs []int `json:"cpus,omitempty"`
}

// handshake wire constants.
const (
	helloMagic = 0x52544831 // "RTH1"
	nonceSize  = 32
	helloSize  = 4 + 8 + 4 + 4 + sha256.Size
	statusOK   = 1
)

// accepted is a handshaken connection from a higher rank.
type accepted struct {
	rank int
	conn net.Conn
	link transport.Link
	err  error
}

// connect runs the rendezvous and returns one link per peer (nil at this
// rank). Lower ranks accept, higher ranks dial.
func (e *Engine) connect(ctx context.Context) ([]transport.Link, error) {
	if e.cfg.Size == 1 {
		return make([]transport.Link, 1), nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	secret, err := e.secret(ctx)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(e.opts.ListenHost, strconv.Itoa(e.opts.ListenPort)))
	if err != nil {
		return nil, &comm.TransportError{Rank: e.cfg.Rank, Peer: -1, Err: fmt.Errorf("listen: %w", err)}
	}
	e.ln = ln
	infos, err := e.exchangeInfos(ctx, ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		return nil, err
	}
	useShm, err := e.shmPolicy(infos)
	if err != nil {
		return nil, err
	}
	flat, err := e.createGroup(infos)
	if err != nil {
		return nil, err
	}
	if e.grp != nil {
		defer e.grp.Unlink() // every peer mapped it once connect returns
	}
	links, err := e.linkAll(ctx, ln, secret, infos, useShm)
	if err != nil {
		return nil, err
	}
	if err := e.finishShm(links, infos, flat); err != nil {
		e.closeLinks(links)
		return nil, err
	}
	setTCPWait(links, infos, e.opts.HostID)
	return links, nil
}

// setTCPWait sets the wait policy of the TCP data links (transport.TCPWait)
// from the CPU affinity of the group's ranks on this host: poll for
// transport.SpinFor, yielding to other processes too when those ranks
// outnumber their CPUs.
func setTCPWait(links []transport.Link, infos []peerInfo, host string) {
	var masks [][]int
	for _, in := range infos {
		if in.Host == host {
			masks = append(masks, in.CPUs)
		}
	}
	w := transport.TCPWait{Spin: transport.SpinFor}
	w.Yield = transport.SpinBudget(len(masks), masks) == 0
	for _, l := range links {
		if t, ok := l.(*transport.TCPLink); ok {
			t.SetWait(w)
		}
	}
}

// exchangeInfos publishes this rank's address (port on AdvertiseHost),
// host, pid and CPU affinity, and reads every rank's.
func (e *Engine) exchangeInfos(ctx context.Context, port int) ([]peerInfo, error) {
	st := e.cfg.Store
	me := peerInfo{Addr: net.JoinHostPort(e.opts.AdvertiseHost, strconv.Itoa(port)), Host: e.opts.HostID, PID: os.Getpid(), CPUs: transport.AffinityCPUs()}
	b, _ := json.Marshal(me)
	if err := st.Set(ctx, e.rankKey(e.cfg.Rank), b); err != nil {
		return nil, fmt.Errorf("cpu: publishing rank %d address: %w", e.cfg.Rank, err)
	}
	infos := make([]peerInfo, e.cfg.Size)
	for r := range e.cfg.Size {
		v, err := st.Get(ctx, e.rankKey(r))
		if err != nil {
			return nil, &comm.TransportError{Rank: e.cfg.Rank, Peer: r, Err: fmt.Errorf("rendezvous: waiting for rank %d's address: %w", r, err)}
		}
		if err := json.Unmarshal(v, &infos[r]); err != nil {
			return nil, &comm.TransportError{Rank: e.cfg.Rank, Peer: r, Err: fmt.Errorf("rendezvous: bad address record of rank %d: %w", r, err)}
		}
	}
	return infos, nil
}

// shmPolicy returns whether the link to a peer uses shm (Transport, and
// whether the peer is on this host); it fails for Transport "shm" with a
// peer on another host.
func (e *Engine) shmPolicy(infos []peerInfo) (func(peer int) (bool, error), error) {
	useShm := func(peer int) (bool, error) {
		same := infos[peer].Host == e.opts.HostID
		switch e.opts.Transport {
		case TransportTCP:
			return false, nil
		case TransportSHM:
			if !same {
				return false, fmt.Errorf("%w: cpu: transport shm but rank %d is on another host (%s)", comm.ErrInvalidArgument, peer, infos[peer].Host)
			}
			return true, nil
		}
		return same, nil
	}
	for r := range e.cfg.Size {
		if _, err := useShm(r); err != nil {
			return nil, err
		}
	}
	return useShm, nil
}

// createGroup reports whether the group gets a group segment
// (transport/shm_group.go): every rank on this host over shm, at most
// transport.MaxFlatRanks of them. Group rank 0 creates it (e.grp) and
// hands it to every rank in the handshake. Every rank decides alike from
// infos.
func (e *Engine) createGroup(infos []peerInfo) (bool, error) {
	flat := e.opts.FlatThreshold > 0 && e.cfg.Size <= transport.MaxFlatRanks && e.opts.Transport != TransportTCP
	for r := range e.cfg.Size {
		flat = flat && infos[r].Host == e.opts.HostID
	}
	if flat && e.cfg.Rank == 0 {
		g, err := transport.CreateGroupShm(e.opts.ShmDir, e.cfg.Size, e.opts.SlotBytes)
		if err != nil {
			return false, &comm.TransportError{Rank: e.cfg.Rank, Peer: -1, Err: fmt.Errorf("creating the group shm segment: %w", err)}
		}
		e.grp = g
	}
	return flat, nil
}

// linkAll dials every lower rank and accepts every higher one.
func (e *Engine) linkAll(ctx context.Context, ln net.Listener, secret []byte, infos []peerInfo, useShm func(int) (bool, error)) ([]transport.Link, error) {
	links := make([]transport.Link, e.cfg.Size)
	acc := make(chan accepted, e.cfg.Size)
	go e.acceptLoop(ln, secret, useShm, acc)
	for r := 0; r < e.cfg.Rank; r++ {
		l, err := e.dial(ctx, r, infos[r].Addr, secret)
		if err != nil {
			e.closeLinks(links)
			return nil, &comm.TransportError{Rank: e.cfg.Rank, Peer: r, Err: err}
		}
		links[r] = l
	}
	for missing := e.cfg.Size - 1 - e.cfg.Rank; missing > 0; missing-- {
		select {
		case a := <-acc:
			if a.err != nil {
				e.closeLinks(links)
				return nil, &comm.TransportError{Rank: e.cfg.Rank, Peer: a.rank, Err: a.err}
			}
			links[a.rank] = a.link
		case <-ctx.Done():
			e.closeLinks(links)
			first := -1
			for r := e.cfg.Rank + 1; r < e.cfg.Size; r++ {
				if links[r] == nil {
					first = r
					break
				}
			}
			return nil, &comm.TransportError{Rank: e.cfg.Rank, Peer: first, Err: fmt.Errorf("rendezvous: rank %d did not connect: %w", first, ctx.Err())}
		}
	}
	return links, nil
}

// finishShm registers the shm links with the engine's Ctl and sets the
// group segment's wait policy from every rank's CPU affinity.
func (e *Engine) finishShm(links []transport.Link, infos []peerInfo, flat bool) error {
	for p, l := range links {
		if s, ok := l.(*transport.ShmLink); ok {
			e.shms = append(e.shms, s)
			e.ctl.Pumps = append(e.ctl.Pumps, s)
			if infos[p].PID != os.Getpid() {
				e.ctl.YieldOS = true
			}
		}
	}
	if !flat {
		return nil
	}
	if e.grp == nil {
		return &comm.TransportError{Rank: e.cfg.Rank, Peer: 0, Err: errors.New("rendezvous: rank 0 sent no group shm segment")}
	}
	masks := make([][]int, e.cfg.Size)
	for r := range e.cfg.Size {
		masks[r] = infos[r].CPUs
	}
	e.grp.Spin = transport.SpinBudget(e.cfg.Size, masks)
	if e.grp.Spin == 0 {
		e.grp.Yield = transport.SpinFor
	}
	if e.ctl.YieldOS {
		e.attachGroup()
	}
	return nil
}

// attachGroup makes the group segment's doorbells the wake-up of every
// wait (transport/shm_group.go, transport/doorbell_linux.go) once the
// links are up, when the group spans processes. A group whose ranks are
// all goroutines of this process (tests, the inmem transport) keeps the
// backoff of transport/link.go, which yields to the Go scheduler.
func (e *Engine) attachGroup() { e.ctl.UseDoorbell(e.grp) }

func (e *Engine) closeLinks(links []transport.Link) {
	for _, l := range links {
		if l != nil {
			l.Close()
		}
	}
}

// secret returns the job's handshake secret: group rank 0 creates it with
// CompareAndSet (only if absent), everyone reads it.
func (e *Engine) secret(ctx context.Context) ([]byte, error) {
	if e.cfg.Rank == 0 {
		var raw [32]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, err
		}
		v, err := e.cfg.Store.CompareAndSet(ctx, secretKey, nil, []byte(hex.EncodeToString(raw[:])))
		if err != nil {
			return nil, fmt.Errorf("cpu: creating the job secret: %w", err)
		}
		return v, nil
	}
	v, err := e.cfg.Store.Get(ctx, secretKey)
	if err != nil {
		// Group rank 0 writes the secret: if it is not there, that rank
		// has not reached this group's creation (or died before it).
		return nil, &comm.TransportError{Rank: e.cfg.Rank, Peer: 0,
			Err: fmt.Errorf("reading the job secret, which rank %d (group rank 0 of %q) creates: %w", e.globalRank(0), e.cfg.Group, err)}
	}
	return v, nil
}

func mac(secret, nonce, hello []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(nonce)
	h.Write(hello)
	return h.Sum(nil)
}

// dial connects to lower rank r and authenticates.
func (e *Engine) dial(ctx context.Context, r int, addr string, secret []byte) (transport.Link, error) {
	var d net.Dialer
	var conn net.Conn
	var err error
	for {
		conn, err = d.DialContext(ctx, "tcp", addr)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dialing rank %d at %s: %w", r, addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	fail := func(err error) (transport.Link, error) {
		_ = conn.Close()
		return nil, fmt.Errorf("handshake with rank %d at %s: %w", r, addr, err)
	}
	nonce := make([]byte, nonceSize)
	if _, err := io.ReadFull(conn, nonce); err != nil {
		return fail(err)
	}
	hello := make([]byte, helloSize)
	le := binary.LittleEndian
	le.PutUint32(hello[0:], helloMagic)
	le.PutUint64(hello[4:], comm.GroupHash(e.cfg.Group))
	le.PutUint32(hello[12:], e.cfg.Epoch)
	le.PutUint32(hello[16:], uint32(e.cfg.Rank))
	copy(hello[20:], mac(secret, nonce, hello[:20]))
	if _, err := conn.Write(hello); err != nil {
		return fail(err)
	}
	var st [3]byte
	if _, err := io.ReadFull(conn, st[:]); err != nil {
		return fail(fmt.Errorf("rejected (wrong job secret, group or epoch?): %w", err))
	}
	if st[0] != statusOK {
		return fail(errors.New("rejected"))
	}
	name := make([]byte, le.Uint16(st[1:]))
	if _, err := io.ReadFull(conn, name); err != nil {
		return fail(err)
	}
	var gl [2]byte
	if _, err := io.ReadFull(conn, gl[:]); err != nil {
		return fail(err)
	}
	gname := make([]byte, le.Uint16(gl[:]))
	if _, err := io.ReadFull(conn, gname); err != nil {
		return fail(err)
	}
	var s *transport.ShmLink
	if len(name) > 0 {
		s, err = transport.OpenShm(string(name), e.opts.ShmRingBytes, false)
		if err == nil && len(gname) > 0 && r == 0 {
			var g *transport.ShmGroup
			if g, err = transport.OpenGroupShm(string(gname), e.cfg.Size, e.opts.SlotBytes, e.cfg.Rank); err == nil {
				e.grp = g
			} else {
				s.Unmap()
			}
		}
		ack := []byte{statusOK}
		if err != nil {
			ack[0] = 0
		}
		if _, werr := conn.Write(ack); werr != nil && err == nil {
			s.Unmap()
			return fail(werr)
		}
		if err != nil {
			return fail(err)
		}
	}
	_ = conn.SetDeadline(time.Time{})
	return e.newLink(r, conn, s), nil
}

// newLink wraps an authenticated connection: a tcp data link, or an shm
// link whose control channel is the connection.
func (e *Engine) newLink(peer int, conn net.Conn, s *transport.ShmLink) transport.Link {
	// The handshake read conn directly: nothing is buffered (nil reader).
	if s == nil {
		return transport.NewTCPLink(peer, conn, nil, e.ctl, true)
	}
	s.Start(peer, e.ctl, transport.NewTCPLink(peer, conn, nil, e.ctl, false))
	return s
}

// acceptLoop accepts connections until the listener closes. Connections
// from expected higher ranks are handed to connect through acc; anything
// else (a wrong secret, a stray or repeated connection) is rejected and
// logged.
func (e *Engine) acceptLoop(ln net.Listener, secret []byte, useShm func(int) (bool, error), acc chan<- accepted) {
	seen := make(map[int]bool)
	type result struct {
		rank int
		conn net.Conn
		shm  *transport.ShmLink
		err  error
	}
	results := make(chan result)
	conns := make(chan net.Conn)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
		}
	}()
	for {
		select {
		case c, ok := <-conns:
			if !ok {
				return
			}
			go func() {
				r, s, err := e.serverHandshake(c, secret, useShm)
				select {
				case results <- result{r, c, s, err}:
				case <-e.ctl.Stop:
					_ = c.Close()
					if s != nil {
						s.Unmap()
					}
				}
			}()
		case res := <-results:
			if res.err == nil && seen[res.rank] {
				res.err = fmt.Errorf("rank %d is already connected", res.rank)
			}
			if res.err != nil {
				e.log.Warn().Str("remote", res.conn.RemoteAddr().String()).Err(res.err).Msg("cpu engine rejected a connection")
				_ = res.conn.Close()
				if res.shm != nil {
					res.shm.Unmap()
				}
				continue
			}
			seen[res.rank] = true
			acc <- accepted{rank: res.rank, link: e.newLink(res.rank, res.conn, res.shm)}
		}
	}
}

// serverHandshake authenticates a dialer: it sends a nonce and expects an
// HMAC of it under the job secret, plus the right group, epoch and a
// higher rank. For an shm pair it creates the segment, sends its name and
// unlinks it once the peer mapped it.
func (e *Engine) serverHandshake(c net.Conn, secret []byte, useShm func(int) (bool, error)) (int, *transport.ShmLink, error) {
	_ = c.SetDeadline(time.Now().Add(min(e.cfg.Timeout, 30*time.Second)))
	nonce := make([]byte, nonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return -1, nil, err
	}
	if _, err := c.Write(nonce); err != nil {
		return -1, nil, err
	}
	hello := make([]byte, helloSize)
	if _, err := io.ReadFull(c, hello); err != nil {
		return -1, nil, fmt.Errorf("reading hello: %w", err)
	}
	le := binary.LittleEndian
	if le.Uint32(hello[0:]) != helloMagic {
		return -1, nil, errors.New("not a ranktree cpu engine hello")
	}
	if !hmac.Equal(hello[20:], mac(secret, nonce, hello[:20])) {
		return -1, nil, errors.New("wrong job secret")
	}
	if g, ep := le.Uint64(hello[4:]), le.Uint32(hello[12:]); g != comm.GroupHash(e.cfg.Group) || ep != e.cfg.Epoch {
		return -1, nil, fmt.Errorf("wrong group or epoch (group hash %#x epoch %d)", g, ep)
	}
	r := int(le.Uint32(hello[16:]))
	if r <= e.cfg.Rank || r >= e.cfg.Size {
		return r, nil, fmt.Errorf("unexpected rank %d", r)
	}
	shm, _ := useShm(r)
	var s *transport.ShmLink
	var name string
	if shm {
		var err error
		s, err = transport.CreateShm(e.opts.ShmDir, e.opts.ShmRingBytes)
		if err != nil {
			return r, nil, fmt.Errorf("creating shm segment for rank %d: %w", r, err)
		}
		name = s.Path
	}
	// The group segment's name follows (rank 0 only; else empty).
	var gname string
	if s != nil && e.cfg.Rank == 0 && e.grp != nil {
		gname = e.grp.Path
	}
	st := make([]byte, 3+len(name)+2+len(gname))
	st[0] = statusOK
	le.PutUint16(st[1:], uint16(len(name)))
	copy(st[3:], name)
	le.PutUint16(st[3+len(name):], uint16(len(gname)))
	copy(st[5+len(name):], gname)
	if _, err := c.Write(st); err != nil {
		if s != nil {
			s.Unlink()
		}
		return r, s, err
	}
	if s != nil {
		var ack [1]byte
		_, err := io.ReadFull(c, ack[:])
		s.Unlink()
		if err != nil || ack[0] != statusOK {
			return r, s, fmt.Errorf("rank %d could not map the shm segment", r)
		}
	}
	_ = c.SetDeadline(time.Time{})
	return r, s, nil
}
