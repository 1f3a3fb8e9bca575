package cheader

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestProtoString(t *testing.T) {
	for _, c := range []struct {
		p    Proto
		want string
	}{
		{NewProto("f", "int"), "int f(void)"},
		{NewProto("g", "const char*", "int", "void*"), "const char* g(int, void*)"},
	} {
		if got := c.p.String(); got != c.want {
			t.Errorf("%#v.String() = %q, want %q", c.p, got, c.want)
		}
	}
	if p := NewProto("f", "int"); p.Params != nil {
		t.Errorf("NewProto without parameters has Params %#v, want nil", p.Params)
	}
}

// text is preprocessed-header-like C for the text readers.
const text = `
typedef struct cfg_v1 { size_t size; unsigned int magic, version; int a[4]; const char* name; } cfg_t;
typedef enum { rSuccess = 0, rError = 1, rLast } res_t;
typedef enum other_tag { oA, oB } other_t;
res_t getCfg(cfg_t* c);
res_t  reset (void);
`

func TestTextReaders(t *testing.T) {
	if got, want := StructFields(Block(text, "struct", "cfg_t")), []string{"size", "magic", "version", "a", "name"}; !slices.Equal(got, want) {
		t.Errorf("StructFields(cfg_t) = %v, want %v", got, want)
	}
	if got, want := EnumMembers(Block(text, "enum", "res_t")), []string{"rSuccess", "rError", "rLast"}; !slices.Equal(got, want) {
		t.Errorf("EnumMembers(res_t) = %v, want %v", got, want)
	}
	if got, want := EnumMembers(Block(text, "enum", "other_t")), []string{"oA", "oB"}; !slices.Equal(got, want) {
		t.Errorf("EnumMembers(other_t) = %v, want %v", got, want)
	}
	if b := Block(text, "struct", "missing_t"); b != "" {
		t.Errorf("Block(missing_t) = %q, want \"\"", b)
	}
	for name, want := range map[string]bool{"getCfg": true, "reset": true, "get": false, "cfg_t": false} {
		if got := Declares(text, name); got != want {
			t.Errorf("Declares(%q) = %v, want %v", name, got, want)
		}
	}
}

const goSrc = `package p

const (
	A     = 1
	B int = 2
	S     = "s"
)

func f() {
	call(l.fn.x, 1, 2)
	call(l.fn.x, 1, 2, 3)
	purego.SyscallN(l.fn.y)
	other(l.fn.z, 1)
}
`

func TestGoReaders(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", goSrc, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	files := []*ast.File{f}
	if got, want := ConstNames(files), []string{"A", "B"}; !slices.Equal(got, want) {
		t.Errorf("ConstNames = %v, want %v", got, want)
	}
	arity := CallArity(files)
	if got, want := arity["x"], []int{2, 3}; !slices.Equal(got, want) {
		t.Errorf("CallArity[x] = %v, want %v", got, want)
	}
	if got, want := arity["y"], []int{0}; !slices.Equal(got, want) {
		t.Errorf("CallArity[y] = %v, want %v", got, want)
	}
	if _, ok := arity["z"]; ok || len(arity) != 2 {
		t.Errorf("CallArity = %v, want only x and y", arity)
	}
}

func TestParseGoPackage(t *testing.T) {
	files := ParseGoPackage(t, ".", "cheader")
	var names []string
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				names = append(names, fd.Name.Name)
			}
		}
	}
	for _, want := range []string{"NewProto", "ParseGoPackage"} {
		if !slices.Contains(names, want) {
			t.Errorf("ParseGoPackage(\".\") misses %s (has %v)", want, names)
		}
	}
	if slices.Contains(names, "TestParseGoPackage") {
		t.Error("ParseGoPackage(\".\") parsed a _test.go file")
	}
	// Another package's folder, or one without Go files: the test skips.
	var skipped bool
	t.Run("elsewhere", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		ParseGoPackage(t, t.TempDir(), "cheader")
	})
	if !skipped {
		t.Error("ParseGoPackage did not skip a folder without the package")
	}
}

// TestGCC runs the gcc helpers on the C library's own headers.
func TestGCC(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("no gcc: %v", err)
	}
	if !Declares(Preprocess(t, nil, "stdlib.h"), "abs") {
		t.Error("preprocessed <stdlib.h> does not declare abs")
	}
	lines := CompileRun(t, nil, "#include <stdio.h>\nint main(void) { printf(\"a 1 2\\nb 3\\n\"); return 0; }\n")
	if got := len(lines); got != 2 || strings.Join(lines[0], ",") != "a,1,2" || strings.Join(lines[1], ",") != "b,3" {
		t.Errorf("CompileRun lines = %q", lines)
	}
	CheckSignatures(t, nil, "stdlib.h", []Proto{NewProto("abs", "int", "int"), NewProto("free", "void", "void*")})
}
