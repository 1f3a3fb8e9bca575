// Package lint holds repository-wide checks that run as tests: today the
// function-length rule of docs/architecture (funclen_test.go). It has no
// non-test code.
package lint
