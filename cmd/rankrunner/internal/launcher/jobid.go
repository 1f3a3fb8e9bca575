package launcher

import (
	"crypto/rand"
	"encoding/hex"
)

// randomJobID returns a fresh job id, "job-" and 12 hex digits (torchrun's
// default --rdzv-id is a fixed "none"; a random id keeps concurrent
// single-node jobs apart on a shared NATS server).
func randomJobID() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return "job-" + hex.EncodeToString(b[:])
}
