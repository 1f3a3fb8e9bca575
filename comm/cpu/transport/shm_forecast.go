package transport

import (
	"time"

	"github.com/ranktree/ranktree/comm"
)

// The forecast of a wait (docs/algorithms.md, "Waiting", predictive
// waits). In training the ranks skew in a pattern that repeats every
// step: the same rank, late by about the same time, at the same op. A
// waiter asleep when its peer arrives wakes 25-70 µs later on the
// development VM (a KVM guest), however it sleeps; only a waiter that is
// already spinning wakes at once. So a group remembers how long the
// recent waits of each op and wait position lasted, and when they agree
// on a long wait, the next one sleeps until shortly before the predicted
// arrival (a precise timer, the doorbell still armed) and spins through a
// window around it that is at most a tenth of the wait. Waits that do not
// repeat (random skew, a pattern that changed) are not forecast and follow
// the plain policy of pace.next.
//
// A forecast is state of the progress goroutine (no locking), a pure
// function of what was recorded: tests feed it durations.
const (
	// forecastSlots is how many (op, wait position) keys a group
	// remembers at once (direct-mapped: two keys that collide take turns).
	forecastSlots = 64
	// forecastLen is how many recent waits of a key are kept; a key is
	// forecast when forecastQuorum of them agree (a wait the peer made
	// longer or shorter now and then does not stop the forecast).
	forecastLen    = 8
	forecastQuorum = 5
	// forecastWaits is how many of an op's waits (the first ones, where
	// a late peer shows) are forecast and recorded; later ones are not.
	forecastWaits = 4
	// forecastMaxBytes: the waits of ops of at least this many bytes per
	// rank (the ring's, by default) are not forecast. The peer's first
	// message then takes about as long to copy in as a sleeping waiter
	// takes to wake, so a waiter woken by the doorbell loses little, and
	// one awake at the arrival spins through the copy: at 1 MiB, 2 ranks,
	// 5 ms late, the forecast took the waiting rank from 9.2 to 11.7 % of
	// a core for a median lag of -19 µs instead of -5 to +4.
	forecastMaxBytes = 256 << 10
	// minForecast: waits shorter than this are not forecast (the plain
	// policy's spin and first slice serve them).
	minForecast = time.Millisecond
	// windowShare: the spin window is at most 1/windowShare of the
	// predicted wait, so that a forecast wait burns at most about 10 % of
	// a core; maxWindow caps it for long waits.
	windowShare = 10
	maxWindow   = time.Millisecond
	// defaultLead is how long before the predicted arrival a nap ends
	// before any nap measured the timer's lateness; leadGuard is added to
	// the median recent lateness once one did.
	defaultLead = 150 * time.Microsecond
	leadGuard   = 20 * time.Microsecond
	// lateLen is how many naps' lateness lead looks at.
	lateLen = 8
)

// waitHist is the recent waits of one key.
type waitHist struct {
	key uint64
	n   uint8 // waits held, at most forecastLen
	i   uint8 // the next to overwrite
	d   [forecastLen]time.Duration
}

// forecast is one group's record of its recent waits and of how late its
// naps' timers fired.
type forecast struct {
	h [forecastSlots]waitHist
	// late is the lateness of the last naps that ran to their timer;
	// ln of them are valid, li is the next to overwrite.
	late   [lateLen]time.Duration
	ln, li uint8
}

// opKey identifies an op by what repeats from step to step (not its
// seq): the collective, element type, reduction, count and root.
func opKey(fp *comm.Fingerprint) uint64 {
	k := uint64(fp.Op) | uint64(fp.DType)<<8 | uint64(fp.RedOp)<<16 | uint64(uint32(fp.Root))<<24
	return mix64(k ^ mix64(uint64(fp.Count)))
}

// waitKey is the key of the n-th wait (from 0) of the op with key op;
// never 0 (which means "no key").
func waitKey(op uint64, n int) uint64 { return mix64(op+uint64(n)*0x9e3779b97f4a7c15) | 1 }

// mix64 is a 64-bit finalizer (splitmix64's).
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// record adds a wait of key that lasted d.
func (f *forecast) record(key uint64, d time.Duration) {
	e := &f.h[key%forecastSlots]
	if e.key != key {
		*e = waitHist{key: key}
	}
	e.d[e.i] = d
	e.i = (e.i + 1) % forecastLen
	e.n = min(e.n+1, forecastLen)
}

// noteLate records that a nap's timer fired d after its deadline.
func (f *forecast) noteLate(d time.Duration) {
	f.late[f.li] = d
	f.li = (f.li + 1) % lateLen
	f.ln = min(f.ln+1, lateLen)
}

// lead is how long before the predicted arrival a nap should end so that
// its timer fires before it, most of the time: the median of the recent
// naps' lateness plus leadGuard. (Their largest, about the 80th
// percentile, met the arrival as often in the median, for about 1 % of a
// core more at 5 ms: the prediction, the earliest of its agreeing waits,
// already leaves most arrivals some time after the window opens.)
func (f *forecast) lead() time.Duration {
	if f.ln == 0 {
		return defaultLead
	}
	var d [lateLen]time.Duration
	n := copy(d[:], f.late[:f.ln])
	sortDurations(d[:n])
	return d[n/2] + leadGuard
}

// plan is the forecast for a wait of key, as offsets from its start: nap
// (doorbell armed) until napTo, then spin until spinTo, then follow the
// plain policy. Zeros: no forecast. A key is forecast when, of its last
// forecastLen waits, forecastQuorum lasted at least minForecast and
// agree: they lie within half a window of the shortest of them, the
// prediction (a peer seldom comes earlier than the early end of its
// recent arrivals). The window is a tenth of the prediction (at most
// maxWindow); it starts lead() before the prediction (at most half the
// window) and ends after it. Waits that do not repeat (random skew, a
// pattern that alternates) have no quorum.
func (f *forecast) plan(key uint64) (napTo, spinTo time.Duration) {
	e := &f.h[key%forecastSlots]
	if key == 0 || e.key != key || e.n < forecastQuorum {
		return 0, 0
	}
	var d [forecastLen]time.Duration
	n := 0
	for _, x := range e.d[:e.n] {
		if x >= minForecast {
			d[n] = x
			n++
		}
	}
	if n < forecastQuorum {
		return 0, 0 // the common case of short waits: no sort
	}
	sortDurations(d[:n])
	for i := 0; i+forecastQuorum <= n; i++ {
		p := d[i]
		w := min(p/windowShare, maxWindow)
		if d[i+forecastQuorum-1]-p > w/2 {
			continue // too few alike from here
		}
		lead := min(f.lead(), w/2)
		return p - lead, p - lead + w
	}
	return 0, 0
}

// sortDurations sorts d in place (insertion sort: forecastLen elements,
// no allocation).
func sortDurations(d []time.Duration) {
	for i := 1; i < len(d); i++ {
		for j := i; j > 0 && d[j] < d[j-1]; j-- {
			d[j], d[j-1] = d[j-1], d[j]
		}
	}
}
