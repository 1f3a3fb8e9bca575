package natsstore

import "github.com/nats-io/nuid"

// nuidNext returns a unique id (JetStream message ids, add request ids).
func nuidNext() string { return nuid.Next() }
