package actors

import (
	"fmt"
	"time"
)

// Event kinds: the last token of an event's NATS subject.
const (
	KindWork      = "work"       // a Work changed state (scheduled, started, completed, failed)
	KindCommInit  = "comm_init"  // a communicator connected (group, epoch, engine, device)
	KindCommAbort = "comm_abort" // a communicator was aborted (locally or by a peer)
	KindWatchdog  = "watchdog"   // the watchdog acted (timeout, async error, dump, teardown)
	KindRestart   = "restart"    // a communicator was re-created under a new epoch
	KindDrops     = "drops"      // the publisher dropped events (Dropped counts them)
	KindRank      = "rank"       // rank life cycle: init, closed
)

// Work states in events and the flight recorder.
const (
	StateScheduled = "scheduled"
	StateStarted   = "started"
	StateCompleted = "completed"
	StateFailed    = "failed"
)

// EventSchemaVersion is the version of the event JSON (docs/events.md,
// docs/events.schema.json) carried in every event as "schema_version". It
// grows by one whenever a field's meaning changes or a field or kind is
// removed; consumers should accept unknown kinds and ignore unknown detail keys.
const EventSchemaVersion = 1

// Event is one JSON message on ranktree.<job>.events.<rank>.<kind>. Fields
// that do not apply to a kind are omitted. The publisher sets
// SchemaVersion, Job, Rank and (when zero) Time.
type Event struct {
	SchemaVersion int `json:"schema_version"` // EventSchemaVersion

	Job     string    `json:"job"`
	Rank    int       `json:"rank"` // global rank of the publisher
	Kind    string    `json:"kind"`
	Time    time.Time `json:"time"`
	Group   string    `json:"group,omitempty"`
	Epoch   uint32    `json:"epoch,omitempty"`
	Seq     uint64    `json:"seq,omitempty"`
	P2PSeq  uint64    `json:"p2p_seq,omitempty"`
	Op      string    `json:"op,omitempty"`    // c10d OpType name, e.g. "ALLREDUCE"
	State   string    `json:"state,omitempty"` // for KindWork
	DType   string    `json:"dtype,omitempty"`
	Count   int64     `json:"count,omitempty"`       // elements
	DurUS   float64   `json:"duration_us,omitempty"` // for completed/failed work
	Error   string    `json:"error,omitempty"`
	Action  string    `json:"action,omitempty"` // watchdog/restart action taken
	Dropped uint64    `json:"dropped,omitempty"`
	// Detail carries kind-specific extras (device UUID, PCI bus id, engine).
	Detail map[string]string `json:"detail,omitempty"`
}

// EventSubject is the NATS subject for an event: ranktree.<job>.events.<rank>.<kind>.
func EventSubject(job string, rank int, kind string) string {
	return fmt.Sprintf("ranktree.%s.events.%d.%s", job, rank, kind)
}

// EventWildcard is the subject that matches every event of a job.
func EventWildcard(job string) string { return "ranktree." + job + ".events.>" }
