package natsstore

import (
	"fmt"
	"strings"
)

// Key encoding. NATS KV keys allow only [-/_=.a-zA-Z0-9], with '.' separating
// subject tokens that may not be empty. A store key is split on '/', each
// segment becomes one token, so "restart/0/abort/" watches map onto the
// subject filter "restart.0.abort.>". Inside a segment the bytes [A-Za-z0-9_-]
// stay as they are and every other byte becomes "=XX" (upper-case hex); an
// empty segment is the token "=". The encoding is injective and reversible.

const hexDigits = "0123456789ABCDEF"

func keepByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// encodeSegment encodes one '/'-free piece of a key as one subject token.
func encodeSegment(b *strings.Builder, seg string) {
	if seg == "" {
		b.WriteByte('=')
		return
	}
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if keepByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xF])
	}
}

// EncodeKey maps an arbitrary store key to a NATS-legal KV key (see the
// encoding rules above). DecodeKey inverts it.
func EncodeKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 8)
	for i, seg := range strings.Split(key, "/") {
		if i > 0 {
			b.WriteByte('.')
		}
		encodeSegment(&b, seg)
	}
	return b.String()
}

// DecodeKey inverts EncodeKey. It returns an error for text EncodeKey never
// produces (e.g. keys written into the bucket by another tool).
func DecodeKey(enc string) (string, error) {
	var b strings.Builder
	for i, tok := range strings.Split(enc, ".") {
		if i > 0 {
			b.WriteByte('/')
		}
		if tok == "=" {
			continue
		}
		if tok == "" {
			return "", fmt.Errorf("natsstore: bad encoded key %q: empty token", enc)
		}
		for j := 0; j < len(tok); j++ {
			c := tok[j]
			if keepByte(c) {
				b.WriteByte(c)
				continue
			}
			if c != '=' || j+2 >= len(tok) {
				return "", fmt.Errorf("natsstore: bad encoded key %q at byte %d", enc, j)
			}
			hi, lo := unhex(tok[j+1]), unhex(tok[j+2])
			if hi < 0 || lo < 0 {
				return "", fmt.Errorf("natsstore: bad escape in encoded key %q at byte %d", enc, j)
			}
			b.WriteByte(byte(hi<<4 | lo))
			j += 2
		}
	}
	return b.String(), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// watchFilter returns the KV subject filter (encoded) covering every key with
// the given prefix: the complete '/'-segments of the prefix become literal
// tokens followed by ">", the trailing partial segment is checked by the
// caller on the decoded key. An empty result means "all keys".
func watchFilter(prefix string) string {
	i := strings.LastIndexByte(prefix, '/')
	if i < 0 {
		return ">"
	}
	return EncodeKey(prefix[:i]) + ".>"
}

// BucketForJob returns the KV bucket name for a job: "ranktree-" followed by
// the job name with bytes outside [A-Za-z0-9-] written as "_XX" (hex), so
// distinct jobs never share a bucket.
func BucketForJob(job string) string {
	var b strings.Builder
	b.WriteString("ranktree-")
	for i := 0; i < len(job); i++ {
		c := job[i]
		if c != '_' && keepByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('_')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xF])
	}
	return b.String()
}
