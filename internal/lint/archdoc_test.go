package lint

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// archDoc is the page TestArchitectureDoc keeps true, from the repository
// root.
const archDoc = "docs/architecture.md"

// minArchRefs is how many references archDoc must at least hold, so that a
// broken pattern (or an emptied page) cannot pass by checking nothing.
const minArchRefs = 100

// fileRef matches a file named by its path from the repository root,
// ending in .go or .md, with an optional declaration after a colon: Name
// (a top-level func, type, var or const) or Recv.Method. It is the
// reference syntax documented at the top of docs/architecture.md.
// A match counts only where it is a whole token: not preceded or
// followed by a path character (pathChar), so that "a.gopher" or
// "x/a.go/" name nothing.
var fileRef = regexp.MustCompile(`((?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-][A-Za-z0-9_.-]*\.(?:go|md))(?::([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?))?`)

// pathChar reports whether c may be part of a path token.
func pathChar(c byte) bool {
	return c == '/' || c == '.' || c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// dirRef matches a directory in backticks: `path/from/root/`.
var dirRef = regexp.MustCompile("`((?:[A-Za-z0-9_.-]+/)+)`")

// archRef is one reference of the page: a path, and the declaration it
// names in that file ("" for the file alone).
type archRef struct {
	line int
	path string
	decl string
	dir  bool
}

func (r archRef) String() string {
	s := r.path
	if r.decl != "" {
		s += ":" + r.decl
	}
	return fmt.Sprintf("line %d: %s", r.line, s)
}

// archRefs extracts every reference of text, in order.
func archRefs(text string) []archRef {
	var out []archRef
	for i, line := range strings.Split(text, "\n") {
		for _, m := range fileRef.FindAllStringSubmatchIndex(line, -1) {
			start, end := m[0], m[1]
			if start > 0 && pathChar(line[start-1]) || end < len(line) && line[end] == '/' ||
				end < len(line) && m[4] < 0 && pathChar(line[end]) && line[end] != '.' {
				continue // part of a longer token
			}
			r := archRef{line: i + 1, path: line[m[2]:m[3]]}
			if m[4] >= 0 {
				r.decl = line[m[4]:m[5]]
			}
			out = append(out, r)
		}
		for _, m := range dirRef.FindAllStringSubmatch(line, -1) {
			out = append(out, archRef{line: i + 1, path: m[1], dir: true})
		}
	}
	return out
}

// goDecls lists the top-level names a Go file declares: funcs, types,
// vars, consts, and methods as "Recv.Method" (funcName's form).
func goDecls(path string) (map[string]bool, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			names[funcName(d)] = true
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					names[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names[n.Name] = true
					}
				}
			}
		}
	}
	return names, nil
}

// brokenRefs checks refs against the tree at root and returns one line per
// reference that does not hold: a missing file or directory, or a
// declaration the file does not make.
func brokenRefs(root string, refs []archRef) []string {
	var bad []string
	decls := map[string]map[string]bool{}
	for _, r := range refs {
		full := filepath.Join(root, filepath.FromSlash(r.path))
		st, err := os.Stat(full)
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("%v: %s does not exist", r, r.path))
			continue
		case r.dir != st.IsDir():
			bad = append(bad, fmt.Sprintf("%v: %s is not a %s", r, r.path, map[bool]string{true: "directory", false: "file"}[r.dir]))
			continue
		case r.decl == "":
			continue
		}
		names, ok := decls[r.path]
		if !ok {
			if names, err = goDecls(full); err != nil {
				bad = append(bad, fmt.Sprintf("%v: %v", r, err))
				continue
			}
			decls[r.path] = names
		}
		if !names[r.decl] {
			bad = append(bad, fmt.Sprintf("%v: %s declares no %s", r, r.path, r.decl))
		}
	}
	return bad
}

// TestArchitectureDoc keeps docs/architecture.md true: every file,
// directory and declaration it names must exist where it says. When code
// moves, fix the page (or the code) so that this passes.
func TestArchitectureDoc(t *testing.T) {
	root := repoRoot(t)
	text, err := os.ReadFile(filepath.Join(root, archDoc))
	if err != nil {
		t.Fatal(err)
	}
	refs := archRefs(string(text))
	if len(refs) < minArchRefs {
		t.Fatalf("%s holds %d references, want at least %d: is the reference pattern broken?", archDoc, len(refs), minArchRefs)
	}
	for _, want := range []string{"## Diagram 1: the path of one op", "## Diagram 2: the lifetime of a group", "## Who owns what state"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("%s lost its section %q", archDoc, want)
		}
	}
	if bad := brokenRefs(root, refs); len(bad) > 0 {
		sort.Strings(bad)
		t.Errorf("%s names %d things that no longer exist; fix the page or the code:\n\t%s",
			archDoc, len(bad), strings.Join(bad, "\n\t"))
	}
}

// TestArchRefsCheck: the extractor finds paths, declarations, methods and
// directories in prose and diagrams, and the checker names each broken one.
func TestArchRefsCheck(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "p", "q"), 0o755); err != nil {
		t.Fatal(err)
	}
	src := "package q\n\ntype T struct{}\n\nfunc (t *T) M() {}\n\nfunc F() {}\n\nvar V, W = 1, 2\n\nconst C = 3\n"
	if err := os.WriteFile(filepath.Join(dir, "p", "q", "a.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := "see `p/q/a.go` and `p/q/`, `p/`\n" +
		"│ p/q/a.go:F → p/q/a.go:T.M (p/q/a.go:V, p/q/a.go:C).\n" +
		"gone: p/q/b.go, p/q/a.go:G, p/q/a.go:T.N, `p/r/`, `p/q/a.go/`, docs/x.md\n" +
		"not refs: go.mod, e.g. github.com/x/y, a.gopher, Work.Wait\n"
	refs := archRefs(doc)
	var got []string
	for _, r := range refs {
		got = append(got, r.String())
	}
	want := []string{
		"line 1: p/q/a.go", "line 1: p/q/", "line 1: p/",
		"line 2: p/q/a.go:F", "line 2: p/q/a.go:T.M", "line 2: p/q/a.go:V", "line 2: p/q/a.go:C",
		"line 3: p/q/b.go", "line 3: p/q/a.go:G", "line 3: p/q/a.go:T.N", "line 3: docs/x.md", "line 3: p/r/", "line 3: p/q/a.go/",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("archRefs found\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
	bad := brokenRefs(dir, refs)
	if len(bad) != 6 {
		t.Fatalf("brokenRefs = %d lines, want 6 (b.go, G, T.N, docs/x.md, p/r/, a.go/):\n\t%s", len(bad), strings.Join(bad, "\n\t"))
	}
	for i, part := range []string{"p/q/b.go does not exist", "declares no G", "declares no T.N", "docs/x.md does not exist", "p/r/ does not exist", "p/q/a.go/ is not a directory"} {
		if !strings.Contains(bad[i], part) {
			t.Errorf("brokenRefs[%d] = %q, want it to say %q", i, bad[i], part)
		}
	}
}

// modulePath is the module's import path (go.mod).
const modulePath = "github.com/ranktree/ranktree"

// layerRow is one package of the layering block of docs/architecture.md:
// its directory ("" for the root package), its layer and the module
// packages it says it imports.
type layerRow struct {
	line    int
	layer   int
	dir     string
	imports []string
}

// layerStart matches a row's head: an optional "layer N", the package
// ("dir/" or "root") and the arrow.
var layerStart = regexp.MustCompile(`^(?:layer (\d+))?\s+(root|[a-z0-9_/.-]+/)\s+→ (.*)$`)

// layerRows parses the first code block after "## Layering": rows are
// "[layer N]  pkg/  → a/, b/" and a row whose list ends with a comma goes
// on on the next line; "nothing of ours" is the empty list.
func layerRows(text string) ([]layerRow, error) {
	lines := strings.Split(text, "\n")
	i := 0
	for i < len(lines) && lines[i] != "## Layering" {
		i++
	}
	for i < len(lines) && !strings.HasPrefix(lines[i], "```") {
		i++
	}
	if i == len(lines) {
		return nil, fmt.Errorf("no code block after a \"## Layering\" heading")
	}
	var rows []layerRow
	layer, open := -1, false
	for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
		line := lines[i]
		var list string
		if open {
			list = strings.TrimSpace(line)
		} else {
			m := layerStart.FindStringSubmatch(line)
			if m == nil {
				return nil, fmt.Errorf("line %d: %q is not a layering row", i+1, line)
			}
			if m[1] != "" {
				fmt.Sscan(m[1], &layer)
			}
			dir := strings.TrimSuffix(m[2], "/")
			if dir == "root" {
				dir = ""
			}
			rows = append(rows, layerRow{line: i + 1, layer: layer, dir: dir})
			list = m[3]
		}
		row := &rows[len(rows)-1]
		open = strings.HasSuffix(list, ",")
		if list == "nothing of ours" {
			continue
		}
		for _, p := range strings.Split(strings.TrimSuffix(list, ","), ",") {
			p = strings.TrimSuffix(strings.TrimSpace(p), "/")
			if p == "root" {
				p = ""
			}
			row.imports = append(row.imports, p)
		}
	}
	return rows, nil
}

// moduleImports returns the module packages (directories, "" for the
// root) that the non-test .go files of dir import.
func moduleImports(root, dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(dir), "*.go"))
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		n++
		pf, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			return nil, err
		}
		for _, im := range pf.Imports {
			p := strings.Trim(im.Path.Value, `"`)
			if p == modulePath {
				set[""] = true
			} else if rest, ok := strings.CutPrefix(p, modulePath+"/"); ok {
				set[rest] = true
			}
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("no Go package in %q", dir)
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// layerProblems checks rows against the sources under root: each row's
// imports are exactly its package's, and each import is a listed package
// of a lower layer.
func layerProblems(root string, rows []layerRow) []string {
	var bad []string
	layerOf := map[string]int{}
	for _, r := range rows {
		layerOf[r.dir] = r.layer
	}
	name := func(dir string) string {
		if dir == "" {
			return "root"
		}
		return dir + "/"
	}
	for _, r := range rows {
		got, err := moduleImports(root, r.dir)
		if err != nil {
			bad = append(bad, fmt.Sprintf("line %d: %s: %v", r.line, name(r.dir), err))
			continue
		}
		want := append([]string(nil), r.imports...)
		sort.Strings(want)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			bad = append(bad, fmt.Sprintf("line %d: %s imports [%s], the page says [%s]", r.line, name(r.dir),
				strings.Join(mapNames(got, name), ", "), strings.Join(mapNames(want, name), ", ")))
		}
		for _, p := range got {
			l, ok := layerOf[p]
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("line %d: %s imports %s, which no row lists", r.line, name(r.dir), name(p)))
			case l >= r.layer:
				bad = append(bad, fmt.Sprintf("line %d: %s (layer %d) imports %s of layer %d: not a lower layer", r.line, name(r.dir), r.layer, name(p), l))
			}
		}
	}
	return bad
}

// mapNames applies name to every dir.
func mapNames(dirs []string, name func(string) string) []string {
	out := make([]string, len(dirs))
	for i, d := range dirs {
		out[i] = name(d)
	}
	return out
}

// TestArchitectureLayers keeps the layering block of docs/architecture.md
// true: the imports it lists are each package's, and they only go down.
func TestArchitectureLayers(t *testing.T) {
	root := repoRoot(t)
	text, err := os.ReadFile(filepath.Join(root, archDoc))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := layerRows(string(text))
	if err != nil {
		t.Fatalf("%s: %v", archDoc, err)
	}
	if len(rows) < 10 {
		t.Fatalf("%s: %d layering rows, want the whole stack", archDoc, len(rows))
	}
	if bad := layerProblems(root, rows); len(bad) > 0 {
		t.Errorf("%s: the layering block is out of date; fix the page, or the import that breaks the layers:\n\t%s",
			archDoc, strings.Join(bad, "\n\t"))
	}
}

// TestLayerProblemsFinds: the layering check reads rows with continuation
// lines and names a wrong import list, an upward import and an unlisted
// package.
func TestLayerProblemsFinds(t *testing.T) {
	dir := t.TempDir()
	pkgs := map[string]string{
		"a": "package a\n",
		"b": "package b\n\nimport _ \"" + modulePath + "/a\"\n",
		"c": "package c\n\nimport (\n\t_ \"" + modulePath + "/a\"\n\t_ \"" + modulePath + "/b\"\n\t_ \"" + modulePath + "/x\"\n)\n",
	}
	for p, src := range pkgs {
		if err := os.MkdirAll(filepath.Join(dir, p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p, p+".go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	doc := "## Layering\n\n```\nlayer 0  a/   → nothing of ours\n         b/   → a/\nlayer 1  c/   → a/,\n                b/\n```\n"
	rows, err := layerRows(doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[2].layer != 1 || strings.Join(rows[2].imports, " ") != "a b" {
		t.Fatalf("layerRows = %+v", rows)
	}
	bad := layerProblems(dir, rows)
	want := []string{
		"b/ (layer 0) imports a/ of layer 0: not a lower layer",
		"c/ imports [a/, b/, x/], the page says [a/, b/]",
		"c/ imports x/, which no row lists",
	}
	if len(bad) != len(want) {
		t.Fatalf("layerProblems = \n\t%s\nwant %d lines", strings.Join(bad, "\n\t"), len(want))
	}
	for i, w := range want {
		if !strings.Contains(bad[i], w) {
			t.Errorf("layerProblems[%d] = %q, want it to say %q", i, bad[i], w)
		}
	}
}
