// Package cheader checks Go bindings of C libraries against the libraries'
// real headers with gcc: it preprocesses a header, reads declarations out
// of the preprocessed text, compiles and runs small C programs that print
// what the header defines, and compiles the C prototypes a binding assumes
// against the header's own. It also reads a Go package's source for the
// call sites and constants a binding's tables must cover. It is used by
// the header tests of comm/cuda and comm/nccl.
//
// The functions that run gcc take the calling test: they skip it when no
// include directories are configured and fail it when gcc cannot do its
// part.
package cheader

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Proto is the C prototype a binding assumes for one entry point: the
// argument kinds and order it passes, written in the header's types.
type Proto struct {
	Name   string
	Ret    string
	Params []string // nil: no parameters
}

// NewProto returns the prototype ret name(params...); no params means
// (void).
func NewProto(name, ret string, params ...string) Proto {
	return Proto{Name: name, Ret: ret, Params: params}
}

// String is the prototype in C, e.g. "int f(void)".
func (p Proto) String() string {
	return fmt.Sprintf("%s %s(%s)", p.Ret, p.Name, p.paramList())
}

// paramList is the C parameter list: the types, or "void".
func (p Proto) paramList() string {
	if len(p.Params) == 0 {
		return "void"
	}
	return strings.Join(p.Params, ", ")
}

// IncludeDirs returns the colon-separated include directories in the
// environment variable env, skipping the test when it is unset and
// failing it when gcc is missing.
func IncludeDirs(t testing.TB, env string) []string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		t.Skipf("%s unset: no headers to check against (scripts/reallib-check.sh sets it)", env)
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatalf("%s is set but gcc is missing: %v", env, err)
	}
	var dirs []string
	for _, d := range strings.Split(v, ":") {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// gcc runs gcc with -I for each of dirs, the given arguments and the
// warnings that must be errors; it returns gcc's combined output.
func gcc(dirs []string, args ...string) (string, error) {
	a := append([]string{"-Werror=incompatible-pointer-types", "-Werror=implicit-function-declaration"}, incFlags(dirs)...)
	out, err := exec.Command("gcc", append(a, args...)...).CombinedOutput()
	return string(out), err
}

func incFlags(dirs []string) []string {
	var a []string
	for _, d := range dirs {
		a = append(a, "-I"+d)
	}
	return a
}

// Preprocess returns the preprocessed text of a file that includes
// header: what the compiler sees, without comments or line markers.
func Preprocess(t testing.TB, dirs []string, header string) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "pp.c")
	if err := os.WriteFile(src, []byte("#include <"+header+">\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("gcc", append(append([]string{"-E", "-P"}, incFlags(dirs)...), src)...).Output()
	if err != nil {
		t.Fatalf("gcc -E of <%s> with %v: %v", header, dirs, err)
	}
	return string(out)
}

// CompileRun compiles the C program src into an executable, runs it and
// returns its output lines split into fields.
func CompileRun(t testing.TB, dirs []string, src string) [][]string {
	t.Helper()
	dir := t.TempDir()
	c, exe := filepath.Join(dir, "facts.c"), filepath.Join(dir, "facts")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := gcc(dirs, "-o", exe, c); err != nil {
		t.Fatalf("gcc: %v\n%s\nprogram:\n%s", err, out, numbered(src))
	}
	out, err := exec.Command(exe).Output()
	if err != nil {
		t.Fatalf("running the C program: %v", err)
	}
	var lines [][]string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		lines = append(lines, strings.Fields(l))
	}
	return lines
}

// numbered is src with line numbers, for failure messages.
func numbered(src string) string {
	var b strings.Builder
	for i, l := range strings.Split(src, "\n") {
		fmt.Fprintf(&b, "%4d  %s\n", i+1, l)
	}
	return b.String()
}

// Declares reports whether the preprocessed text declares function name.
func Declares(text, name string) bool {
	return regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\s*\(`).MatchString(text)
}

// Block returns the body of `typedef <kind> [tag] { body } name;` in the
// preprocessed text, or "" if there is none; kind is "struct" or "enum".
func Block(text, kind, name string) string {
	re := regexp.MustCompile(`typedef\s+` + kind + `(?:\s+\w+)?\s*\{([^{}]*)\}\s*` + regexp.QuoteMeta(name) + `\s*;`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		return ""
	}
	return m[1]
}

var trailingIdent = regexp.MustCompile(`([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$`)

// StructFields returns the member names of a struct body, in order.
func StructFields(body string) []string {
	var names []string
	for _, decl := range strings.Split(body, ";") {
		decl = strings.TrimSpace(decl)
		if decl == "" {
			continue
		}
		// "int a, b" declares a and b; the type is on the first one.
		for _, part := range strings.Split(decl, ",") {
			if m := trailingIdent.FindStringSubmatch(strings.TrimSpace(part)); m != nil {
				names = append(names, m[1])
			}
		}
	}
	return names
}

var leadingIdent = regexp.MustCompile(`^\s*([A-Za-z_]\w*)`)

// EnumMembers returns the member names of an enum body, in order.
func EnumMembers(body string) []string {
	var names []string
	for _, part := range strings.Split(body, ",") {
		if m := leadingIdent.FindStringSubmatch(part); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

// signatureProgram returns a C file that assigns each symbol to a pointer
// of the prototype we assume, and the symbol on each of its lines.
func signatureProgram(header string, protos []Proto) (string, map[int]string) {
	var b strings.Builder
	fmt.Fprintf(&b, "#include <%s>\n", header)
	line := 2
	lines := map[int]string{}
	for _, p := range protos {
		fmt.Fprintf(&b, "typedef %s (*ranktree_%s_t)(%s);\n", p.Ret, p.Name, p.paramList())
		fmt.Fprintf(&b, "ranktree_%s_t ranktree_%s = %s;\n", p.Name, p.Name, p.Name)
		lines[line], lines[line+1] = p.Name, p.Name
		line += 2
	}
	return b.String(), lines
}

// CheckSignatures compiles, against header, an assignment of each
// symbol to a function pointer of the prototype the binding assumes; a
// prototype that does not match the header fails the test naming its
// symbol and gcc's message. On success it logs the symbols checked.
func CheckSignatures(t testing.TB, dirs []string, header string, protos []Proto) {
	t.Helper()
	src, lines := signatureProgram(header, protos)
	dir := t.TempDir()
	c := filepath.Join(dir, "sigs.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := gcc(dirs, "-c", "-o", filepath.Join(dir, "sigs.o"), c)
	if err == nil {
		var names []string
		for _, p := range protos {
			names = append(names, p.Name)
		}
		t.Logf("%d prototypes match <%s>: %s", len(protos), header, strings.Join(names, ", "))
		return
	}
	bySym := map[string][]string{}
	re := regexp.MustCompile(`sigs\.c:(\d+):\d+: (?:error|warning|note)`)
	for _, l := range strings.Split(out, "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			if sym, ok := lines[n]; ok {
				bySym[sym] = append(bySym[sym], strings.TrimSpace(l))
			}
		}
	}
	for _, p := range protos {
		if msgs := bySym[p.Name]; len(msgs) > 0 {
			t.Errorf("%s: the prototype our binding assumes, %s, does not match <%s>:\n\t%s", p.Name, p, header, strings.Join(msgs, "\n\t"))
		}
	}
	if len(bySym) == 0 {
		t.Errorf("gcc failed on the signature program: %v\n%s\nprogram:\n%s", err, out, numbered(src))
	}
}
