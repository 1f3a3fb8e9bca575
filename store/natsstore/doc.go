// Package natsstore is ranktree's job store over NATS JetStream KV: one
// bucket per job (BucketForJob), History 8, file storage. It implements
// store.Store with c10d semantics and is what ranktree.Init connects to.
//
// # The caller's duties
//
//  1. Have a NATS server with JetStream: StartEmbedded runs one in-process
//     (rankrunner does this by default); multi-node jobs point every rank at
//     one server or cluster. The embedded server also runs the add service
//     (ServeAdds); next to an external server, run ServeAdds yourself for
//     fast large rendezvous (Add works without it, by compare-and-swap).
//  2. Open the store with Connect (own connection, closed by Close) or
//     NewFromConn (shared connection, left open by Close). Use the same job
//     name on every rank.
//  3. Bound every call with a context; Get and Wait are additionally bounded
//     by the store timeout (Options.Timeout, default 5 min as c10d).
//  4. Handle store.ErrTimeout (keys did not appear), store.ErrUnavailable
//     (NATS unreachable for longer than the bound, or a write interrupted by
//     an outage whose outcome is unknown) and store.ErrClosed. A value is
//     never misreported: during an outage calls wait for the reconnect or
//     fail with one of these.
//  5. Close the store when done.
//
// # How it works
//
// Keys are encoded reversibly into NATS-legal KV keys (EncodeKey): '/'
// separates subject tokens, so prefix watches map onto subject filters.
// Every write carries a unique message id and is retried with it across
// reconnects (JetStream de-duplicates). Add and CompareAndSet are
// revision-checked writes (Nats-Expected-Last-Subject-Sequence) retried with
// jittered backoff; concurrent Adds through one Store are combined, and the
// add service combines Adds from many connections. Get and Wait wake on a
// subscription to the key's subject, read the value back from the stream,
// and fall back to a KV watch; after a reconnect they re-arm, so a wait
// survives a NATS restart. Watch rides on a KV watch re-created from the
// last delivered revision after reconnects.
package natsstore
