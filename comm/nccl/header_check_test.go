package nccl

// Header checks: this package binds libnccl at run time from our own
// reading of nccl.h. TestHeaderNCCL compiles small C programs against a
// real nccl.h (with internal/cheader) and compares ncclConfig_t's layout,
// NCCL_CONFIG_INITIALIZER, every enum value and constant we mirror, and
// the C prototype of every entry point we bind with the Go side. It needs
// gcc and RANKTREE_NCCL_INCLUDE (a colon-separated list of include
// directories holding nccl.h and the CUDA runtime headers it includes),
// which scripts/reallib-check.sh sets; without the variable it skips. The
// other TestHeaderNCCL* tests need no headers: they check that the tables
// below cover every symbol, call and constant of the package's source.

import (
	"fmt"
	"go/ast"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/internal/cheader"
)

const envNCCLInclude = "RANKTREE_NCCL_INCLUDE"

// hdrNCCLGoOnly lists the package's numeric constants that mirror nothing
// in nccl.h (TestHeaderNCCLCalls checks that every other one is in
// hdrNCCLConsts).
var hdrNCCLGoOnly = []string{"spinMinProcs"}

// hdrNCCLProtos lists every symbol lib.go binds. Count arguments are
// size_t (Go passes uintptr(int)), ranks and roots int (Go passes the low
// 32 bits of a sign-extended int), handles and buffers pointers.
var hdrNCCLProtos = []cheader.Proto{
	cheader.NewProto("ncclGetVersion", "ncclResult_t", "int*"),
	cheader.NewProto("ncclGetUniqueId", "ncclResult_t", "ncclUniqueId*"),
	cheader.NewProto("ncclCommInitRankConfig", "ncclResult_t", "ncclComm_t*", "int", "ncclUniqueId", "int", "ncclConfig_t*"),
	cheader.NewProto("ncclCommGetAsyncError", "ncclResult_t", "ncclComm_t", "ncclResult_t*"),
	cheader.NewProto("ncclCommAbort", "ncclResult_t", "ncclComm_t"),
	cheader.NewProto("ncclCommFinalize", "ncclResult_t", "ncclComm_t"),
	cheader.NewProto("ncclCommDestroy", "ncclResult_t", "ncclComm_t"),
	cheader.NewProto("ncclCommSplit", "ncclResult_t", "ncclComm_t", "int", "int", "ncclComm_t*", "ncclConfig_t*"),
	cheader.NewProto("ncclCommCount", "ncclResult_t", "ncclComm_t", "int*"),
	cheader.NewProto("ncclCommUserRank", "ncclResult_t", "ncclComm_t", "int*"),
	cheader.NewProto("ncclCommCuDevice", "ncclResult_t", "ncclComm_t", "int*"),
	cheader.NewProto("ncclGetErrorString", "const char*", "ncclResult_t"),
	cheader.NewProto("ncclGetLastError", "const char*", "ncclComm_t"),
	cheader.NewProto("ncclAllReduce", "ncclResult_t", "const void*", "void*", "size_t", "ncclDataType_t", "ncclRedOp_t", "ncclComm_t", "cudaStream_t"),
	cheader.NewProto("ncclBroadcast", "ncclResult_t", "const void*", "void*", "size_t", "ncclDataType_t", "int", "ncclComm_t", "cudaStream_t"),
	cheader.NewProto("ncclReduce", "ncclResult_t", "const void*", "void*", "size_t", "ncclDataType_t", "ncclRedOp_t", "int", "ncclComm_t", "cudaStream_t"),
	cheader.NewProto("ncclAllGather", "ncclResult_t", "const void*", "void*", "size_t", "ncclDataType_t", "ncclComm_t", "cudaStream_t"),
	cheader.NewProto("ncclReduceScatter", "ncclResult_t", "const void*", "void*", "size_t", "ncclDataType_t", "ncclRedOp_t", "ncclComm_t", "cudaStream_t"),
	cheader.NewProto("ncclSend", "ncclResult_t", "const void*", "size_t", "ncclDataType_t", "int", "ncclComm_t", "cudaStream_t"),
	cheader.NewProto("ncclRecv", "ncclResult_t", "void*", "size_t", "ncclDataType_t", "int", "ncclComm_t", "cudaStream_t"),
	cheader.NewProto("ncclGroupStart", "ncclResult_t"),
	cheader.NewProto("ncclGroupEnd", "ncclResult_t"),
	cheader.NewProto("ncclRedOpCreatePreMulSum", "ncclResult_t", "ncclRedOp_t*", "void*", "ncclDataType_t", "ncclScalarResidence_t", "ncclComm_t"),
	cheader.NewProto("ncclRedOpDestroy", "ncclResult_t", "ncclRedOp_t", "ncclComm_t"),
}

// hdrNCCLOptional are the symbols Open treats as optional; they are
// checked when the header declares them.
var hdrNCCLOptional = []string{"ncclCommFinalize", "ncclCommSplit", "ncclGetLastError"}

// hdrNCCLTyped is the one symbol bound with purego.RegisterFunc (its
// unique id goes by value); the others go through call's uintptrs.
const hdrNCCLTyped = "ncclCommInitRankConfig"

// hdrConst pairs a Go constant with the C name it mirrors. enum names the
// C enum type the value belongs to ("" for a macro); optional values are
// checked only when that enum has them.
type hdrConst struct {
	goName, cName, enum string
	val                 int64
	optional            bool
}

var hdrNCCLConsts = []hdrConst{
	{"Success", "ncclSuccess", "ncclResult_t", int64(Success), false},
	{"UnhandledCudaError", "ncclUnhandledCudaError", "ncclResult_t", int64(UnhandledCudaError), false},
	{"SystemError", "ncclSystemError", "ncclResult_t", int64(SystemError), false},
	{"InternalError", "ncclInternalError", "ncclResult_t", int64(InternalError), false},
	{"InvalidArgument", "ncclInvalidArgument", "ncclResult_t", int64(InvalidArgument), false},
	{"InvalidUsage", "ncclInvalidUsage", "ncclResult_t", int64(InvalidUsage), false},
	{"RemoteError", "ncclRemoteError", "ncclResult_t", int64(RemoteError), false},
	{"InProgress", "ncclInProgress", "ncclResult_t", int64(InProgress), false},
	{"Timeout", "ncclTimeout", "ncclResult_t", int64(Timeout), true},
	{"Int8", "ncclInt8", "ncclDataType_t", int64(Int8), false},
	{"Uint8", "ncclUint8", "ncclDataType_t", int64(Uint8), false},
	{"Int32", "ncclInt32", "ncclDataType_t", int64(Int32), false},
	{"Uint32", "ncclUint32", "ncclDataType_t", int64(Uint32), false},
	{"Int64", "ncclInt64", "ncclDataType_t", int64(Int64), false},
	{"Uint64", "ncclUint64", "ncclDataType_t", int64(Uint64), false},
	{"Float16", "ncclFloat16", "ncclDataType_t", int64(Float16), false},
	{"Float32", "ncclFloat32", "ncclDataType_t", int64(Float32), false},
	{"Float64", "ncclFloat64", "ncclDataType_t", int64(Float64), false},
	{"Bfloat16", "ncclBfloat16", "ncclDataType_t", int64(Bfloat16), true},
	{"Float8e4m3", "ncclFloat8e4m3", "ncclDataType_t", int64(Float8e4m3), true},
	{"Float8e5m2", "ncclFloat8e5m2", "ncclDataType_t", int64(Float8e5m2), true},
	{"Sum", "ncclSum", "ncclRedOp_t", int64(Sum), false},
	{"Prod", "ncclProd", "ncclRedOp_t", int64(Prod), false},
	{"Max", "ncclMax", "ncclRedOp_t", int64(Max), false},
	{"Min", "ncclMin", "ncclRedOp_t", int64(Min), false},
	{"Avg", "ncclAvg", "ncclRedOp_t", int64(Avg), true},
	{"ScalarDevice", "ncclScalarDevice", "ncclScalarResidence_t", int64(ScalarDevice), false},
	{"ScalarHostImmediate", "ncclScalarHostImmediate", "ncclScalarResidence_t", int64(ScalarHostImmediate), false},
	{"UniqueIDBytes", "NCCL_UNIQUE_ID_BYTES", "", UniqueIDBytes, false},
	{"configUndefInt", "NCCL_CONFIG_UNDEF_INT", "", int64(configUndefInt), false},
	// NCCL 2.28's nccl.h writes the magic as a literal inside
	// NCCL_CONFIG_INITIALIZER (checked through the initializer's magic
	// field) and has no macro for it.
	{"apiMagic", "NCCL_API_MAGIC", "", apiMagic, true},
}

// hdrNCCLSizes pairs C types with the size of the Go type that mirrors
// them.
var hdrNCCLSizes = []struct {
	cType string
	size  uintptr
}{
	{"ncclResult_t", unsafe.Sizeof(Result(0))},
	{"ncclDataType_t", unsafe.Sizeof(DataType(0))},
	{"ncclRedOp_t", unsafe.Sizeof(RedOp(0))},
	{"ncclScalarResidence_t", unsafe.Sizeof(ScalarResidence(0))},
	{"ncclUniqueId", unsafe.Sizeof(UniqueID{})},
	{"ncclComm_t", unsafe.Sizeof(Comm(0))},
	{"cudaStream_t", unsafe.Sizeof(cuda.Stream(0))},
}

// hdrGoInt is a struct field's value as an int64 (unsigned kinds as their
// value, pointers as their address).
func hdrGoInt(v reflect.Value) int64 {
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return int64(v.Uint())
	}
	panic(fmt.Sprintf("field of kind %v", v.Kind()))
}

// hdrNCCLFacts is what the C program reports about nccl.h.
type hdrNCCLFacts struct {
	major, minor, patch, code int
	configSize                int64
	fields                    []hdrCField // ncclConfig_t's members, in order
	consts                    map[string]int64
	sizes                     map[string]int64
	argSizes                  map[string][]int64 // sizeof each parameter, per symbol
	skipped                   []string           // optional constants the header lacks
	text                      string             // preprocessed nccl.h
}

type hdrCField struct {
	name         string
	offset, size int64
	init         int64 // value in NCCL_CONFIG_INITIALIZER
}

func hdrNCCLProgram(t *testing.T, dirs []string) *hdrNCCLFacts {
	t.Helper()
	f := &hdrNCCLFacts{text: cheader.Preprocess(t, dirs, "nccl.h"), consts: map[string]int64{},
		sizes: map[string]int64{}, argSizes: map[string][]int64{}}
	body := cheader.Block(f.text, "struct", "ncclConfig_t")
	if body == "" {
		t.Fatal("nccl.h has no `typedef struct ncclConfig_v... { ... } ncclConfig_t;`")
	}
	names := cheader.StructFields(body)
	enums := map[string][]string{}
	var b strings.Builder
	b.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <nccl.h>\n")
	b.WriteString("int main(void) {\n\tncclConfig_t init = NCCL_CONFIG_INITIALIZER;\n")
	b.WriteString("\tprintf(\"version %d %d %d %d\\n\", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, NCCL_VERSION_CODE);\n")
	b.WriteString("\tprintf(\"configsize %zu\\n\", sizeof(ncclConfig_t));\n")
	for _, n := range names {
		fmt.Fprintf(&b, "\tprintf(\"field %s %%zu %%zu %%lld\\n\", offsetof(ncclConfig_t, %s), sizeof(init.%s), (long long)(intptr_t)init.%s);\n", n, n, n, n)
	}
	for _, c := range hdrNCCLConsts {
		if c.enum != "" {
			if _, ok := enums[c.enum]; !ok {
				enums[c.enum] = cheader.EnumMembers(cheader.Block(f.text, "enum", c.enum))
			}
			if !slices.Contains(enums[c.enum], c.cName) {
				if c.optional {
					f.skipped = append(f.skipped, c.cName)
					continue
				}
				t.Errorf("nccl.h's %s has no %s (Go's %s = %d)", c.enum, c.cName, c.goName, c.val)
				continue
			}
		}
		if c.enum == "" && c.optional && !regexp.MustCompile(`(?m)^\s*#\s*define\s+`+c.cName+`\b`).MatchString(f.text) {
			f.skipped = append(f.skipped, c.cName)
			continue
		}
		fmt.Fprintf(&b, "\tprintf(\"const %s %%lld\\n\", (long long)(%s));\n", c.cName, c.cName)
	}
	for _, s := range hdrNCCLSizes {
		fmt.Fprintf(&b, "\tprintf(\"sizeof %s %%zu\\n\", sizeof(%s));\n", s.cType, s.cType)
	}
	for _, p := range hdrNCCLProtos {
		types := append([]string{p.Ret}, p.Params...)
		for _, ty := range types {
			fmt.Fprintf(&b, "\tprintf(\"argsize %s %%zu\\n\", sizeof(%s));\n", p.Name, ty)
		}
	}
	b.WriteString("\treturn 0;\n}\n")
	for _, l := range cheader.CompileRun(t, dirs, b.String()) {
		atoi := func(s string) int64 {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				t.Fatalf("C program output %q: %v", l, err)
			}
			return n
		}
		switch l[0] {
		case "version":
			f.major, f.minor, f.patch, f.code = int(atoi(l[1])), int(atoi(l[2])), int(atoi(l[3])), int(atoi(l[4]))
		case "configsize":
			f.configSize = atoi(l[1])
		case "field":
			f.fields = append(f.fields, hdrCField{l[1], atoi(l[2]), atoi(l[3]), atoi(l[4])})
		case "const":
			f.consts[l[1]] = atoi(l[2])
		case "sizeof":
			f.sizes[l[1]] = atoi(l[2])
		case "argsize":
			f.argSizes[l[1]] = append(f.argSizes[l[1]], atoi(l[2]))
		}
	}
	return f
}

// TestHeaderNCCL checks the binding against a real nccl.h (see the top of
// this file).
func TestHeaderNCCL(t *testing.T) {
	dirs := cheader.IncludeDirs(t, envNCCLInclude)
	f := hdrNCCLProgram(t, dirs)
	t.Logf("checked against nccl.h %d.%d.%d (NCCL_VERSION_CODE %d) in %s", f.major, f.minor, f.patch, f.code, strings.Join(dirs, ":"))

	var goFields []reflect.StructField
	rt := reflect.TypeFor[Config]()
	for i := range rt.NumField() {
		if fl := rt.Field(i); fl.IsExported() {
			goFields = append(goFields, fl)
		}
	}

	t.Run("ConfigLayout", func(t *testing.T) {
		if got := int64(unsafe.Sizeof(Config{})); got < f.configSize {
			t.Errorf("sizeof: Go's Config is %d bytes, nccl.h's ncclConfig_t %d", got, f.configSize)
		}
		for i, cf := range f.fields {
			if i >= len(goFields) {
				t.Errorf("ncclConfig_t.%s (offset %d) has no Go field: Config has only %d", cf.name, cf.offset, len(goFields))
				continue
			}
			g := goFields[i]
			switch {
			case !strings.EqualFold(g.Name, cf.name):
				t.Errorf("field %d: nccl.h has %s, Go has %s", i, cf.name, g.Name)
			case int64(g.Offset) != cf.offset || int64(g.Type.Size()) != cf.size:
				t.Errorf("%s: nccl.h offset %d size %d, Go's %s offset %d size %d", cf.name, cf.offset, cf.size, g.Name, g.Offset, g.Type.Size())
			}
		}
		if len(goFields) > len(f.fields) {
			var extra []string
			for _, g := range goFields[len(f.fields):] {
				extra = append(extra, g.Name)
			}
			t.Logf("Go's Config has %d fields after nccl.h's %d (newer NCCL): %s", len(extra), len(f.fields), strings.Join(extra, ", "))
		}
		t.Logf("ncclConfig_t: %d fields, %d bytes; Go's Config: %d fields, %d bytes", len(f.fields), f.configSize, len(goFields), unsafe.Sizeof(Config{}))
	})

	t.Run("ConfigInitializer", func(t *testing.T) {
		cfg := reflect.ValueOf(*NewConfig(f.code))
		for i, cf := range f.fields {
			if i >= len(goFields) || !strings.EqualFold(goFields[i].Name, cf.name) {
				t.Errorf("ncclConfig_t.%s: no matching Go field (see ConfigLayout)", cf.name)
				continue
			}
			got := hdrGoInt(cfg.FieldByIndex(goFields[i].Index))
			switch strings.ToLower(cf.name) {
			case "size":
				if cf.init != f.configSize {
					t.Errorf("NCCL_CONFIG_INITIALIZER's size is %d, not sizeof(ncclConfig_t) %d", cf.init, f.configSize)
				}
				if got != int64(configSize) || got < cf.init {
					t.Errorf("NewConfig's Size is %d; want configSize %d, at least C's %d", got, configSize, cf.init)
				}
			case "version":
				if got != int64(f.code) {
					t.Errorf("NewConfig(%d).Version = %d", f.code, got)
				}
				if cf.init != int64(f.code) {
					t.Errorf("NCCL_CONFIG_INITIALIZER's version is %d, NCCL_VERSION_CODE %d", cf.init, f.code)
				}
			case "magic":
				if got != apiMagic || cf.init != apiMagic {
					t.Errorf("magic: NCCL_CONFIG_INITIALIZER has %#x, NewConfig %#x, apiMagic %#x", cf.init, got, apiMagic)
				}
			default:
				if got != cf.init {
					t.Errorf("%s: NCCL_CONFIG_INITIALIZER has %d, NewConfig's %s is %d", cf.name, cf.init, goFields[i].Name, got)
				}
			}
		}
	})

	t.Run("Constants", func(t *testing.T) {
		for _, c := range hdrNCCLConsts {
			v, ok := f.consts[c.cName]
			if !ok {
				continue // reported while building the program, or skipped
			}
			if v != c.val {
				t.Errorf("%s: nccl.h has %d, Go's %s is %d", c.cName, v, c.goName, c.val)
			}
			var s string
			switch c.enum {
			case "ncclResult_t":
				s = Result(c.val).String()
			case "ncclDataType_t":
				s = DataType(c.val).String()
			default:
				continue
			}
			if s != c.cName {
				t.Errorf("%s(%d).String() = %q, want %q", c.enum, c.val, s, c.cName)
			}
		}
		if len(f.skipped) > 0 {
			t.Logf("not in this nccl.h, not checked: %s", strings.Join(f.skipped, ", "))
		}
		for _, s := range hdrNCCLSizes {
			if got := f.sizes[s.cType]; got != int64(s.size) {
				t.Errorf("sizeof(%s) is %d, the Go type's size %d", s.cType, got, s.size)
			}
		}
		t.Logf("%d constants and %d type sizes compared", len(f.consts), len(f.sizes))
	})

	t.Run("Signatures", func(t *testing.T) {
		var protos []cheader.Proto
		for _, p := range hdrNCCLProtos {
			if !cheader.Declares(f.text, p.Name) {
				if slices.Contains(hdrNCCLOptional, p.Name) {
					t.Logf("%s: not declared by this nccl.h (optional), not checked", p.Name)
					continue
				}
				t.Errorf("%s: not declared by nccl.h", p.Name)
				continue
			}
			protos = append(protos, p)
			// Arguments passed as uintptrs must fit a register; the
			// result is read as an int32 ncclResult_t or a pointer.
			sz := f.argSizes[p.Name]
			if p.Name == hdrNCCLTyped {
				continue
			}
			if p.Ret == "ncclResult_t" && sz[0] != 4 {
				t.Errorf("%s returns %d bytes; call reads an int32", p.Name, sz[0])
			}
			for i, n := range sz[1:] {
				if n > int64(unsafe.Sizeof(uintptr(0))) {
					t.Errorf("%s: parameter %d (%s) is %d bytes, more than the uintptr call passes", p.Name, i+1, p.Params[i], n)
				}
			}
		}
		// The typed binding: each Go parameter has its C parameter's size.
		fl, ok := reflect.TypeFor[Lib]().FieldByName("commInitRankConfig")
		if !ok {
			t.Fatalf("Lib has no commInitRankConfig field for %s", hdrNCCLTyped)
		}
		fn := fl.Type
		sz := f.argSizes[hdrNCCLTyped]
		var p cheader.Proto
		for _, q := range hdrNCCLProtos {
			if q.Name == hdrNCCLTyped {
				p = q
			}
		}
		if fn.NumIn() != len(p.Params) || fn.NumOut() != 1 {
			t.Errorf("%s: Go's binding is %v; nccl.h's has %d parameters", hdrNCCLTyped, fn, len(p.Params))
		} else {
			if got := int64(fn.Out(0).Size()); got != sz[0] {
				t.Errorf("%s: Go result %v is %d bytes, C's %s %d", hdrNCCLTyped, fn.Out(0), got, p.Ret, sz[0])
			}
			for i := range fn.NumIn() {
				if got := int64(fn.In(i).Size()); got != sz[i+1] {
					t.Errorf("%s: Go parameter %d (%v) is %d bytes, C's %s %d", hdrNCCLTyped, i, fn.In(i), got, p.Params[i], sz[i+1])
				}
			}
		}
		cheader.CheckSignatures(t, dirs, "nccl.h", protos)
	})
}

// TestHeaderNCCLSymbolTable needs no headers: hdrNCCLProtos names exactly
// the symbols lib.go binds, and hdrNCCLOptional the ones Open treats as
// optional.
func TestHeaderNCCLSymbolTable(t *testing.T) {
	cheader.ParseGoPackage(t, ".", "nccl") // skips outside the package folder
	src, err := os.ReadFile("lib.go")
	if err != nil {
		t.Fatal(err)
	}
	var bound []string
	for _, m := range regexp.MustCompile(`"(nccl[A-Z][A-Za-z]*)"`).FindAllStringSubmatch(string(src), -1) {
		if !slices.Contains(bound, m[1]) {
			bound = append(bound, m[1])
		}
	}
	var listed []string
	for _, p := range hdrNCCLProtos {
		listed = append(listed, p.Name)
	}
	for _, n := range bound {
		if !slices.Contains(listed, n) {
			t.Errorf("lib.go binds %s, which hdrNCCLProtos lacks", n)
		}
	}
	for _, n := range listed {
		if !slices.Contains(bound, n) {
			t.Errorf("hdrNCCLProtos lists %s, which lib.go does not bind", n)
		}
	}
	var optional []string
	for _, m := range regexp.MustCompile(`"(nccl[A-Z][A-Za-z]*)",\s*true\}`).FindAllStringSubmatch(string(src), -1) {
		optional = append(optional, m[1])
	}
	slices.Sort(optional)
	if want := slices.Sorted(slices.Values(hdrNCCLOptional)); !slices.Equal(optional, want) {
		t.Errorf("lib.go's optional symbols are %v; hdrNCCLOptional has %v", optional, want)
	}
	if len(bound) < 20 {
		t.Errorf("found only %d symbol names in lib.go: %v", len(bound), bound)
	}
}

// TestHeaderNCCLCalls needs no headers: every call site passes as many
// arguments as the prototype in hdrNCCLProtos has parameters, and every
// numeric constant of the package is in hdrNCCLConsts.
func TestHeaderNCCLCalls(t *testing.T) {
	files := cheader.ParseGoPackage(t, ".", "nccl")
	// lib.go's Open table: {&f.field, "ncclName", optional}.
	field := map[string]string{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			cl, ok := n.(*ast.CompositeLit)
			if !ok || len(cl.Elts) < 2 {
				return true
			}
			u, ok1 := cl.Elts[0].(*ast.UnaryExpr)
			lit, ok2 := cl.Elts[1].(*ast.BasicLit)
			if !ok1 || !ok2 || u.Op != token.AND || lit.Kind != token.STRING {
				return true
			}
			if sel, ok := u.X.(*ast.SelectorExpr); ok {
				name, _ := strconv.Unquote(lit.Value)
				field[sel.Sel.Name] = name
			}
			return true
		})
	}
	arity := cheader.CallArity(files)
	for _, p := range hdrNCCLProtos {
		if p.Name == hdrNCCLTyped {
			continue
		}
		var fieldName string
		for fl, sym := range field {
			if sym == p.Name {
				fieldName = fl
			}
		}
		if fieldName == "" {
			t.Errorf("%s: no field of lib.go's Open table binds it", p.Name)
			continue
		}
		if len(arity[fieldName]) == 0 {
			t.Errorf("%s: no call(l.fn.%s, ...) in the package", p.Name, fieldName)
		}
		for _, n := range arity[fieldName] {
			if n != len(p.Params) {
				t.Errorf("%s: a call passes %d arguments; the prototype %s has %d", p.Name, n, p, len(p.Params))
			}
		}
	}
	var listed []string
	for _, c := range hdrNCCLConsts {
		listed = append(listed, c.goName)
	}
	for _, n := range cheader.ConstNames(files) {
		if !slices.Contains(listed, n) && !slices.Contains(hdrNCCLGoOnly, n) {
			t.Errorf("constant %s is not in hdrNCCLConsts: add the C name it mirrors (or, if it mirrors none, list it in hdrNCCLGoOnly)", n)
		}
	}
}
