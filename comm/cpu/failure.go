package cpu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/transport"
)

// How a broken communicator tells its peers (docs/semantics.md, "An abort
// is final" and "The real culprit"):
//
//   - A rank whose op fails for a reason that breaks the communicator (a
//     mismatch it found, a dead peer, an engine error) records it as its
//     fatal error and sends a notice to every peer at once.
//   - Abort sends a notice to every peer, waits (at most abortAckWait) until
//     every live peer has acknowledged that it recorded it, and only then
//     closes the connections. So once Abort has returned, no op that a
//     peer starts afterwards can consume data the aborting rank sent
//     before: the peer's fatal error is already set.
//   - Close (Destroy) sends a "closed" notice without waiting. It breaks
//     nothing by itself: a peer that still needs data from the closed rank
//     gets a *comm.RemoteAbortError naming it instead of an EOF.
//
// A notice names the origin, the global rank where the failure started,
// so a rank that relays a failure never takes the blame for it.

// Notice kinds.
const (
	noticeAbort    = "abort"    // the communicator is broken; fail every op from now on
	noticeMismatch = "mismatch" // the sender found a collective mismatch
	noticeClosed   = "closed"   // the sender destroyed the group (orderly)
)

// abortAckWait bounds how long Abort waits for its peers' acknowledgements
// (a stopped or dead peer never sends one).
const abortAckWait = 200 * time.Millisecond

// failNotice is a kindNotice's payload (JSON: notices are rare).
type failNotice struct {
	Kind     string        `json:"kind"`
	Origin   int           `json:"origin"` // global rank where the failure started
	Seq      uint64        `json:"seq,omitempty"`
	Reason   string        `json:"reason,omitempty"`
	Mismatch *mismatchInfo `json:"mismatch,omitempty"`
	Ack      bool          `json:"ack,omitempty"` // the sender waits for a kindAck
}

// mismatchInfo carries a *comm.MismatchError across.
type mismatchInfo struct {
	LocalRank  int              `json:"local_rank"`
	RemoteRank int              `json:"remote_rank"`
	Local      comm.Fingerprint `json:"local"`
	Remote     comm.Fingerprint `json:"remote"`
	Detail     string           `json:"detail,omitempty"`
}

// noticeFor describes err, the error that broke this engine's
// communicator, for the peers.
func (e *Engine) noticeFor(kind string, err error) failNotice {
	var me *comm.MismatchError
	if kind == noticeAbort && errors.As(err, &me) {
		kind = noticeMismatch
	}
	n := failNotice{Kind: kind, Origin: e.globalRank(e.cfg.Rank), Seq: e.failingSeq()}
	if err == nil {
		return n
	}
	if kind == noticeMismatch && me != nil {
		n.Mismatch = &mismatchInfo{LocalRank: me.LocalRank, RemoteRank: me.RemoteRank, Local: me.Local, Remote: me.Remote, Detail: me.Detail}
	}
	origin, seq := comm.Blame(err, e.globalRank(e.cfg.Rank), e.members())
	n.Origin = origin
	if seq != 0 {
		n.Seq = seq
	}
	n.Reason = err.Error()
	var ra *comm.RemoteAbortError
	if errors.As(err, &ra) {
		n.Reason = ra.Reason // the origin's words, not ours around them
	}
	return n
}

// members is the group's global ranks by group rank.
func (e *Engine) members() []int {
	if len(e.cfg.GlobalRanks) == e.cfg.Size {
		return e.cfg.GlobalRanks
	}
	m := make([]int, e.cfg.Size)
	for i := range m {
		m[i] = i
	}
	return m
}

// tell sends n to every peer whose connection is up and, with n.Ack,
// waits until each of them acknowledged it or abortAckWait passed; it
// returns n's encoding and how many acknowledgements are missing. Safe
// from any goroutine; it never blocks on a peer's socket (notices go
// through the links' writer goroutines).
func (e *Engine) tell(n failNotice) (payload []byte, missing int) {
	payload = encodeNotice(n)
	var asked []transport.NoticeLink
	var written []<-chan struct{}
	for _, l := range e.links {
		nl, ok := l.(transport.NoticeLink)
		if l == nil || !ok || !nl.Up() {
			continue
		}
		if w := nl.Notice(payload); w != nil {
			written = append(written, w)
			if n.Ack {
				asked = append(asked, nl)
			}
		}
	}
	// Every notice is on the wire before tell returns (bounded), so that
	// a rank that fails its Work and exits right after has still told
	// its peers why.
	deadline := time.Now().Add(abortAckWait)
	for _, w := range written {
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-w:
		case <-t.C:
		}
		t.Stop()
	}
	if len(asked) == 0 {
		return payload, 0
	}
	// Wait for as many acknowledgements as peers asked, but stop waiting
	// for a peer whose connection goes down meanwhile (it closed or died:
	// it will never answer, and it can use nothing of ours either).
	got := 0
	deadline = time.Now().Add(abortAckWait)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		live := 0
		for _, l := range asked {
			if l.Up() {
				live++
			}
		}
		if got >= live {
			return payload, 0
		}
		if time.Now().After(deadline) {
			e.log.Warn().Int("missing_acks", live-got).Msg("cpu engine: peers did not acknowledge the abort notice in time")
			return payload, live - got
		}
		select {
		case <-e.acks:
			got++
		case <-tick.C:
		}
	}
}

// encodeNotice encodes n, shortening a reason too long for maxNotice.
func encodeNotice(n failNotice) []byte {
	b, err := json.Marshal(n)
	if err != nil || len(b) > transport.MaxNotice {
		n.Reason = n.Reason[:min(len(n.Reason), 1024)]
		b, _ = json.Marshal(n)
	}
	return b
}

// noticeKey is the store key under which rank r leaves its abort notice
// when some peer did not acknowledge it in band (a TCP connection busy
// with a large message cannot carry it before it is closed).
func (e *Engine) noticeKey(r int) string {
	return fmt.Sprintf("cpu/%s/%d/notice/%d", e.cfg.Group, e.cfg.Epoch, r)
}

// storeNotice leaves payload under noticeKey for the peers that did not
// acknowledge it (bounded by abortAckWait).
func (e *Engine) storeNotice(payload []byte) {
	if e.cfg.Store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), abortAckWait)
	defer cancel()
	if err := e.cfg.Store.Set(ctx, e.noticeKey(e.cfg.Rank), payload); err != nil {
		e.log.Warn().Err(err).Msg("cpu engine: could not leave the abort notice in the store")
	}
}

// lateNotice looks, for a bounded time, for the notice peer left in the
// store before its connection broke; it returns the error that notice
// means, or nil (the peer died without a word).
func (e *Engine) lateNotice(peer int) error {
	if e.cfg.Store == nil || e.ctl.Stopped.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), lateNoticeWait)
	defer cancel()
	// An aborting rank writes the key before it closes its connections,
	// so it is there by the time the broken read is seen, or never.
	key := e.noticeKey(peer)
	if ok, err := e.cfg.Store.Check(ctx, []string{key}); err != nil || !ok {
		return nil
	}
	b, err := e.cfg.Store.Get(ctx, key)
	if err != nil {
		return nil
	}
	e.onNotice(peer, b, nil)
	return e.fatal.get()
}

// lateNoticeWait bounds lateNotice's store round trips.
const lateNoticeWait = abortAckWait

// onNotice handles a peer's notice (from a reader goroutine, or the peer's
// own goroutine over the in-memory transport); ack answers the peer on the
// connection the notice came by. It touches no link of the engine's, so it
// may run while New is still connecting the others.
func (e *Engine) onNotice(peer int, payload []byte, ack func()) {
	var n failNotice
	if err := json.Unmarshal(payload, &n); err != nil {
		n = failNotice{Kind: noticeAbort, Origin: e.globalRank(peer), Reason: fmt.Sprintf("unreadable failure notice: %v", err)}
	}
	relay := e.globalRank(peer)
	if n.Kind != noticeClosed && e.ctl.Aborting.Load() {
		// This rank is aborting for a reason of its own (its watchdog's
		// timeout, a cancelled ctx), which its ops fail with once Abort
		// has told the peers: a peer's notice meanwhile is the echo of
		// that abort (the peer relaying it back), not a new cause, and
		// must not replace the reason (a timed-out op would otherwise
		// fail with a RemoteAbortError instead of its TimeoutError).
		if n.Ack && ack != nil {
			ack()
		}
		return
	}
	switch n.Kind {
	case noticeClosed:
		// Not a failure by itself: a later read from peer that finds the
		// connection gone reports this instead of an EOF.
		e.closedBy(peer, &comm.RemoteAbortError{Rank: n.Origin, Seq: n.Seq, Relay: relay, Reason: n.Reason})
	case noticeMismatch:
		var err error = &comm.RemoteAbortError{Rank: n.Origin, Seq: n.Seq, Relay: relay, Reason: n.Reason}
		if m := n.Mismatch; m != nil {
			err = &comm.MismatchError{LocalRank: m.LocalRank, RemoteRank: m.RemoteRank, Local: m.Local, Remote: m.Remote, Detail: m.Detail}
		}
		if e.fatal.set(err, n.Seq) {
			e.log.Error().Err(err).Int("peer", peer).Msg("cpu engine: a peer reported a collective mismatch")
		}
	default:
		err := &comm.RemoteAbortError{Rank: n.Origin, Seq: n.Seq, Relay: relay, Reason: n.Reason}
		if e.fatal.set(err, n.Seq) {
			e.log.Error().Err(err).Int("peer", peer).Msg("cpu engine: a peer aborted the communicator")
		}
	}
	e.ctl.Poke()
	if n.Ack && ack != nil {
		ack()
	}
}

// onAck counts a peer's acknowledgement for tell.
func (e *Engine) onAck(int) {
	select {
	case e.acks <- struct{}{}:
	default:
	}
}

// closedBy records that peer destroyed the group, for the link to peer.
func (e *Engine) closedBy(peer int, err error) {
	if peer >= 0 && peer < len(e.peerClosed) {
		e.peerClosed[peer].CompareAndSwap(nil, &err)
	}
}

// peerClosedErr is the error recorded by closedBy for peer, or nil.
func (e *Engine) peerClosedErr(peer int) error {
	if peer >= 0 && peer < len(e.peerClosed) {
		if p := e.peerClosed[peer].Load(); p != nil {
			return *p
		}
	}
	return nil
}

// broke records err, an error that breaks the communicator, as the
// engine's fatal error and tells every peer. It reports whether err is now
// the fatal error (false if an earlier one was recorded).
func (e *Engine) broke(err error) bool {
	if !e.fatal.set(err, e.failSeq(err)) {
		return false
	}
	var ra *comm.RemoteAbortError
	if !errors.As(err, &ra) { // a remote abort was told by its origin already
		e.tell(e.noticeFor(noticeAbort, err)) // no ack: this never waits
	}
	return true
}

// failSeq is the collective seq where err, which broke this engine, started:
// the seq it blames, else failingSeq.
func (e *Engine) failSeq(err error) uint64 {
	if _, seq := comm.Blame(err, e.globalRank(e.cfg.Rank), e.members()); seq != 0 {
		return seq
	}
	return e.failingSeq()
}

// failingSeq is the first collective seq a failure of this engine that
// names none concerns: the collective the stream runs, or, between ops,
// the next one. The ops this rank finished succeeded here, so they must
// not fail on the peers for its sake (docs/semantics.md, "An abort is
// final"): a rank that completed seq S and then aborted used to send S,
// which failed the peers' S when it ended after the notice. curSeq is
// read first: an op that starts in between is then seen running.
func (e *Engine) failingSeq() uint64 {
	last := e.curSeq.Load()
	if s := e.opSeq.Load(); s != opP2P {
		return unclaimed(s)
	}
	return last + 1
}

// seqClaimed marks, in Engine.opSeq, the seq of the running collective
// once this rank's own Abort or Close named it as the seq its failure
// starts at (claimRunningOp).
const seqClaimed = uint64(1) << 63

// unclaimed is opSeq's value s without the claim (opP2P stays opP2P).
func unclaimed(s uint64) uint64 {
	if s == opP2P {
		return s
	}
	return s &^ seqClaimed
}

// claimRunningOp is called by this rank's own Abort or Close, which set
// e.ending first, before they name in their notice the seq their failure
// starts at (failingSeq). It claims the collective the stream runs, so
// that the op cannot end in success here (Engine.run fails it once it
// sees the claim) while the notice that names its seq fails it on the
// peers: before the claim, an aborting rank whose op finished while the
// abort told its peers returned success for an op the peers failed
// (TestAbortClaimsRunningOp). An op that starts after the claim sees
// e.ending and fails too (its seq is the one named, or a later one).
// The peers keep an op they completed before the notice reached them
// (docs/semantics.md, "An abort is final", the window).
func (e *Engine) claimRunningOp() {
	for {
		s := e.opSeq.Load()
		if s == opP2P || s&seqClaimed != 0 || e.opSeq.CompareAndSwap(s, s|seqClaimed) {
			return
		}
	}
}
