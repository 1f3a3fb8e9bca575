// Package lint holds repository-wide checks that run as tests: the
// function-length rule of issue 17 (funclen_test.go), and
// docs/architecture.md kept true by the code (archdoc_test.go: every file,
// directory and declaration the page names exists, and its layering block
// lists each package's real imports, all of a lower layer). It has no
// non-test code.
package lint
