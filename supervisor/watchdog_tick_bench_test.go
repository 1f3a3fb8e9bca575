package supervisor

import (
	"testing"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
)

// discardEvents is an event sink that keeps nothing.
type discardEvents struct{}

func (discardEvents) Emit(actors.Event) {}

// BenchmarkWatchdogTickAfterBurst measures one watchdog tick (the actor's
// drain, poll and deadline check) after a burst of 10000 small ops that
// all finished since the last tick, as at a high op rate: the time the
// tick holds the rank's thread. Run by hand on the actor's methods (no
// ticker), with events off and with a sink that drops them.
func BenchmarkWatchdogTickAfterBurst(b *testing.B) {
	for _, ev := range []struct {
		name string
		sink EventSink
	}{{"events-off", nil}, {"events-on", discardEvents{}}} {
		b.Run(ev.name, func(b *testing.B) {
			wd, err := NewWatchdog(WatchdogConfig{Rank: 0, Events: ev.sink, Exit: func(int) {},
				Cfg: Config{ErrorHandling: CleanupOnly, Timeout: time.Minute, WatchdogInterval: time.Hour}})
			if err != nil {
				b.Fatal(err)
			}
			wd.handle(RegisterGroup{Spec: GroupSpec{Name: "g", Members: []int{0, 1}}})
			const burst = 10000
			works := make([]*comm.Promise, burst)
			for i := range works {
				works[i] = comm.NewPromise(comm.OpAllReduce)
				works[i].MarkStarted()
				works[i].Complete(nil)
			}
			seq := uint64(0)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for _, w := range works {
					seq++
					wd.Track("g", fpAt(seq), 0, w)
				}
				b.StartTimer()
				wd.drain()
				wd.tick()
			}
		})
	}
}
