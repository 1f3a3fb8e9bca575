package cheader

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// ParseGoPackage parses the non-test Go files of package pkg in dir (a
// test passes "." and its own package's name). It skips the test when dir
// holds no such file: a test binary run outside its source folder (as
// scripts/gpu-check.sh runs them) has no source to read.
func ParseGoPackage(t testing.TB, dir, pkg string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name == pkg {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		abs, _ := filepath.Abs(dir)
		t.Skipf("no source of package %s in %s: the test binary runs outside its package folder", pkg, abs)
	}
	return files
}

// CallArity maps each function-pointer field passed first to call or
// purego.SyscallN (call(l.fn.x, ...) or purego.SyscallN(l.fn.x, ...)) to
// the argument counts of its call sites, not counting the field.
func CallArity(files []*ast.File) map[string][]int {
	arity := map[string][]int{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ce, ok := n.(*ast.CallExpr)
			if !ok || len(ce.Args) == 0 {
				return true
			}
			switch fn := ce.Fun.(type) {
			case *ast.Ident:
				if fn.Name != "call" {
					return true
				}
			case *ast.SelectorExpr:
				if x, ok := fn.X.(*ast.Ident); !ok || x.Name != "purego" || fn.Sel.Name != "SyscallN" {
					return true
				}
			default:
				return true
			}
			if sel, ok := ce.Args[0].(*ast.SelectorExpr); ok {
				arity[sel.Sel.Name] = append(arity[sel.Sel.Name], len(ce.Args)-1)
			}
			return true
		})
	}
	return arity
}

// ConstNames lists the package-level constants of the files that are
// numbers (not strings).
func ConstNames(files []*ast.File) []string {
	var names []string
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				if len(vs.Values) == 1 {
					if bl, ok := vs.Values[0].(*ast.BasicLit); ok && bl.Kind == token.STRING {
						continue
					}
				}
				for _, n := range vs.Names {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}
