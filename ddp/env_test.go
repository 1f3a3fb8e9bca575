package ddp_test

import (
	"os"
	"testing"
)

// unsetenv removes key for the rest of the test (t.Setenv first records
// the value to restore).
func unsetenv(t *testing.T, key string) {
	t.Helper()
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}
