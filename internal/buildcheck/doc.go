// Package buildcheck holds tests about how ranktree builds, not about what
// it does: that building its programs on a fresh machine prints nothing
// (issue 18: go-nvml's cgo printed 29 deprecation warnings on the first
// `go run ./cmd/rankrunner`). It has no code of its own.
//
// The tests:
//
//   - TestNoUnexpectedCgo (always): no non-standard package with cgo files
//     is linked into a main package, except the ones listed in allowedCgo
//     (purego's optional cgo shim). NVML, CUDA and NCCL are loaded at run
//     time through purego.
//   - TestCgoPackagesBuildQuietly (skipped with -short): the cgo packages
//     those programs link, built with an empty build cache, print nothing.
//   - TestFreshBuildQuiet (RANKTREE_FULL_BUILD_CHECK=1): every main
//     package, built with an empty build cache, prints nothing. It takes
//     minutes on two cores, so CI runs it on request.
package buildcheck
