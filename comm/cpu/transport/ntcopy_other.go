//go:build !amd64

package transport

// streamCopy is copy where no non-temporal store is available to Go code
// (see ntcopy_amd64.go).
func streamCopy(dst, src []byte) { copy(dst, src) }
