package comm

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseFaults(t *testing.T) {
	tests := []struct {
		in   string
		want []Fault
	}{
		{"", nil},
		{"  ;  ", nil},
		{"hang@rank=1,seq=5", []Fault{{Kind: "hang", Rank: 1, Seq: 5}}},
		{"crash@rank=2,seq=3", []Fault{{Kind: "crash", Rank: 2, Seq: 3}}},
		{"error@rank=0,seq=2,group=pg1", []Fault{{Kind: "error", Rank: 0, Seq: 2, Group: "pg1"}}},
		{"error@group=pg1,seq=2,rank=0", []Fault{{Kind: "error", Rank: 0, Seq: 2, Group: "pg1"}}},
		{" HANG @ rank = 7 , seq = 1 ;", []Fault{{Kind: "hang", Rank: 7, Seq: 1}}},
		{"hang@rank=1,seq=5;crash@rank=2,seq=3;error@rank=3,seq=9,group=default_pg", []Fault{
			{Kind: "hang", Rank: 1, Seq: 5},
			{Kind: "crash", Rank: 2, Seq: 3},
			{Kind: "error", Rank: 3, Seq: 9, Group: "default_pg"},
		}},
	}
	for _, tt := range tests {
		got, err := ParseFaults(tt.in)
		if err != nil {
			t.Errorf("ParseFaults(%q): %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseFaults(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestParseFaultsErrors(t *testing.T) {
	tests := []struct {
		in, badPart, msg string
	}{
		{"hang", "hang", "missing '@'"},
		{"@rank=1,seq=2", "@rank=1,seq=2", "missing kind"},
		{"explode@rank=1,seq=2", "explode@rank=1,seq=2", "unknown kind"},
		{"hang@rank=1", "hang@rank=1", "missing seq"},
		{"hang@seq=1", "hang@seq=1", "missing rank"},
		{"hang@rank=-1,seq=1", "hang@rank=-1,seq=1", "rank \"-1\""},
		{"hang@rank=abc,seq=1", "hang@rank=abc,seq=1", "rank \"abc\""},
		{"hang@rank=1,seq=0", "hang@rank=1,seq=0", "seq \"0\""},
		{"hang@rank=1,seq=x", "hang@rank=1,seq=x", "seq \"x\""},
		{"hang@rank=1,seq=2,rank=3", "hang@rank=1,seq=2,rank=3", "rank given twice"},
		{"hang@rank=1,seq=2,node=3", "hang@rank=1,seq=2,node=3", "unknown key"},
		{"hang@rank=1,,seq=2", "hang@rank=1,,seq=2", "empty key=value"},
		{"hang@rank=1,seq", "hang@rank=1,seq", "not key=value"},
		{"hang@rank=1,seq=2,group=", "hang@rank=1,seq=2,group=", "group"},
		{"hang@rank=1,seq=2;crash@rank=x,seq=1", "crash@rank=x,seq=1", "rank \"x\""},
	}
	for _, tt := range tests {
		got, err := ParseFaults(tt.in)
		if err == nil {
			t.Errorf("ParseFaults(%q) = %+v, want an error", tt.in, got)
			continue
		}
		var fe *FaultSpecError
		if !errors.As(err, &fe) || !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseFaults(%q): error %T %v is not a *FaultSpecError wrapping ErrInvalidArgument", tt.in, err, err)
			continue
		}
		if fe.Spec != tt.badPart {
			t.Errorf("ParseFaults(%q): bad part %q, want %q", tt.in, fe.Spec, tt.badPart)
		}
		s := err.Error()
		if !strings.Contains(s, "RANKTREE_FAULT") || !strings.Contains(s, tt.msg) || !strings.Contains(s, tt.badPart) {
			t.Errorf("ParseFaults(%q): message %q should name RANKTREE_FAULT, the part and %q", tt.in, s, tt.msg)
		}
	}
}

func TestFaultMatches(t *testing.T) {
	any := Fault{Kind: FaultHang, Rank: 1, Seq: 5}
	pg := Fault{Kind: FaultError, Rank: 1, Seq: 5, Group: "pg1"}
	cases := []struct {
		f     Fault
		rank  int
		group string
		seq   uint64
		want  bool
	}{
		{any, 1, "default_pg", 5, true},
		{any, 1, "pg1", 5, true},
		{any, 0, "default_pg", 5, false},
		{any, 1, "default_pg", 4, false},
		{pg, 1, "pg1", 5, true},
		{pg, 1, "default_pg", 5, false},
	}
	for _, c := range cases {
		if got := c.f.Matches(c.rank, c.group, c.seq); got != c.want {
			t.Errorf("%v.Matches(%d, %q, %d) = %v, want %v", c.f, c.rank, c.group, c.seq, got, c.want)
		}
	}
}

// FuzzParseFaults checks that the parser never panics, and that whatever it
// accepts formats back (Fault.String) to a spec that parses to the same faults.
func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{"hang@rank=1,seq=5", "crash@rank=2,seq=3", "error@rank=0,seq=2,group=pg1",
		"hang@rank=1,seq=5;crash@rank=2,seq=3", "", ";;", "x@y", "hang@rank=99999999999,seq=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		faults, err := ParseFaults(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), FaultEnvVar) {
				t.Fatalf("ParseFaults(%q): error %v does not wrap ErrInvalidArgument or name %s", s, err, FaultEnvVar)
			}
			return
		}
		parts := make([]string, len(faults))
		for i, ft := range faults {
			if ft.Seq == 0 || ft.Rank < 0 {
				t.Fatalf("ParseFaults(%q) accepted %+v", s, ft)
			}
			parts[i] = ft.String()
		}
		again, err := ParseFaults(strings.Join(parts, ";"))
		if err != nil || !reflect.DeepEqual(again, faults) {
			t.Fatalf("round trip of %q: %+v, %v; want %+v", s, again, err, faults)
		}
	})
}
