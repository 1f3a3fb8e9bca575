package natsstore

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestStaleStoreDirsRemoved (issue 14, case 10): a temp store dir whose
// creating process is gone (as after kill -9 of rankrunner) is removed by
// the next StartEmbedded; the dir of a live process and unrelated dirs
// stay.
func TestStaleStoreDirsRemoved(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Skip("no `true` to get a dead PID:", err)
	}
	dead := filepath.Join(tmp, fmt.Sprintf("%s%d-123", tempDirPrefix, c.Process.Pid))
	live := filepath.Join(tmp, fmt.Sprintf("%s%d-456", tempDirPrefix, os.Getpid()))
	other := filepath.Join(tmp, tempDirPrefix+"old-style")
	for _, d := range []string{dead, live, other} {
		if err := os.MkdirAll(filepath.Join(d, "jetstream"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, shutdown, err := StartEmbedded(EmbeddedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("stale dir of dead PID %d still there: %v", c.Process.Pid, err)
	}
	for _, d := range []string{live, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
	ents, _ := os.ReadDir(tmp)
	if len(ents) != 3 { // live, other and this server's own
		t.Errorf("temp dir holds %d entries, want 3", len(ents))
	}
	shutdown()
	ents, _ = os.ReadDir(tmp)
	if len(ents) != 2 {
		t.Errorf("after shutdown the temp dir holds %d entries, want 2", len(ents))
	}
}
