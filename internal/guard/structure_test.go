package guard_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The rules in this file keep sluice's limits structural: they read the
// source of the whole module, so a handler that registers itself, starts
// its own goroutines or fans out without a limit fails the build's tests
// instead of waiting for an outage to be found.
//
//   a. Only package guard registers gRPC services (generated
//      Register…Server functions, grpc.Server.RegisterService and
//      reflection.Register), in tests too.
//   b. Read-path packages — every package under internal/ that is not in
//      goAllowed, and everything under pkg/ — have no go statements
//      outside tests; parallel work goes through fanout.Each.
//   c. Every errgroup.Group anywhere in the module gets SetLimit, in the
//      function that creates it, before its first Go or TryGo.

// goAllowed lists the packages under internal/ that may start goroutines
// of their own: the guard and its fan-out helper, process wiring, the
// admin HTTP server, telemetry exporters and test environments. A package
// missing from this list is a read-path package, so a new package is
// strict until someone argues otherwise here.
var goAllowed = []string{
	"internal/guard",
	"internal/guard/fanout",
	"internal/app",
	"internal/app/apptest",
	"internal/admin",
	"internal/telemetry",
	"internal/testenv",
}

// registrationDir is the one package of sluice allowed to register gRPC
// services.
const registrationDir = "internal/guard"

// peerDir is the benchmarks' bare peer: the server a team would write
// without sluice, unguarded on purpose so that `make bench` can compare
// sluice with it. Nothing under cmd/ or internal/ imports it
// (TestNothingServesThePeer).
const peerDir = "bench/peer"

const (
	errgroupPath   = "golang.org/x/sync/errgroup"
	reflectionPath = "google.golang.org/grpc/reflection"
)

// registerServerName matches generated registration functions such as
// RegisterPostRecordsServer and RegisterHealthServer.
var registerServerName = regexp.MustCompile(`^Register\w*Server$`)

// finding is one violation of a rule, at a position in a source file.
type finding struct {
	pos token.Position
	msg string
}

func (f finding) String() string {
	if strings.Contains(f.msg, fmt.Sprintf("%s:%d", f.pos.Filename, f.pos.Line)) {
		return f.msg
	}
	return fmt.Sprintf("%s: %s", f.pos, f.msg)
}

// at formats a position as file:line for messages.
func at(pos token.Position) string { return fmt.Sprintf("%s:%d", pos.Filename, pos.Line) }

// sourceFile is one parsed Go file of the module.
type sourceFile struct {
	rel  string // slash-separated path from the module root
	dir  string // slash-separated directory from the module root
	test bool   // a _test.go file
	fset *token.FileSet
	file *ast.File
}

// goStrict reports whether the package in dir (relative to the module
// root) is a read-path package that may not contain go statements.
func goStrict(dir string) bool {
	switch {
	case dir == "pkg" || strings.HasPrefix(dir, "pkg/"):
		return true
	case strings.HasPrefix(dir, "internal/"):
		return !slices.Contains(goAllowed, dir)
	}
	return false
}

// mayRegister reports whether the package in dir may register services.
func mayRegister(dir string) bool { return dir == registrationDir || dir == peerDir }

// importNames returns the names under which f imports importPath; "." is
// included for a dot import.
func importNames(f *ast.File, importPath string) map[string]bool {
	names := map[string]bool{}
	for _, imp := range f.Imports {
		p, err := strconv.Unquote(imp.Path.Value)
		if err != nil || p != importPath {
			continue
		}
		if imp.Name != nil {
			names[imp.Name.Name] = true
		} else {
			names[path.Base(p)] = true
		}
	}
	return names
}

// isPkgSel reports whether e is pkg.name for one of the import names.
func isPkgSel(e ast.Expr, pkgs map[string]bool, name string) bool {
	e = ast.Unparen(e)
	if sel, ok := e.(*ast.SelectorExpr); ok {
		id, ok := sel.X.(*ast.Ident)
		return ok && pkgs[id.Name] && sel.Sel.Name == name
	}
	if id, ok := e.(*ast.Ident); ok {
		return pkgs["."] && id.Name == name
	}
	return false
}

// findRegistrations implements rule a: every reference to a generated
// Register…Server function, to a RegisterService method, or to
// reflection.Register. References, not only calls, count, so that a
// function value cannot carry a registration past the rule.
func findRegistrations(fset *token.FileSet, f *ast.File) []finding {
	reflection := importNames(f, reflectionPath)
	var out []finding
	report := func(n ast.Node, what string) {
		out = append(out, finding{fset.Position(n.Pos()), what + "; register services only through guard.Server.Register, which requires a policy for every method"})
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			switch name := n.Sel.Name; {
			case registerServerName.MatchString(name):
				report(n, "uses "+types.ExprString(n))
			case name == "RegisterService":
				report(n, "uses "+types.ExprString(n))
			case isPkgSel(n, reflection, "Register"):
				report(n, "uses "+types.ExprString(n))
			}
		case *ast.CallExpr:
			if id, ok := ast.Unparen(n.Fun).(*ast.Ident); ok {
				if registerServerName.MatchString(id.Name) || isPkgSel(id, reflection, "Register") {
					report(n, "calls "+id.Name)
				}
			}
		}
		return true
	})
	return out
}

// findGoStatements implements rule b for one file of a strict package.
func findGoStatements(fset *token.FileSet, f *ast.File) []finding {
	var out []finding
	ast.Inspect(f, func(n ast.Node) bool {
		if g, ok := n.(*ast.GoStmt); ok {
			out = append(out, finding{fset.Position(g.Pos()), "go statement in a read-path package; run parallel work through fanout.Each, under the request's policy"})
		}
		return true
	})
	return out
}

// groupCreation is one place an errgroup.Group comes into being.
type groupCreation struct {
	expr ast.Expr // the creating expression
	key  string   // the variable it is bound to ("g", "s.group"), or ""
}

// findUnlimitedErrgroups implements rule c: in every function, each
// errgroup.Group the function creates must be bound to a variable whose
// SetLimit is called, with a non-negative limit, before its first Go or
// TryGo. A package-level Group cannot satisfy that and is reported too.
func findUnlimitedErrgroups(fset *token.FileSet, f *ast.File) []finding {
	eg := importNames(f, errgroupPath)
	if len(eg) == 0 {
		return nil
	}
	var out []finding
	isGroupType := func(e ast.Expr) bool { return isPkgSel(e, eg, "Group") }
	// creates reports whether e makes a new Group (or, for WithContext,
	// returns one first).
	creates := func(e ast.Expr) bool {
		switch e := ast.Unparen(e).(type) {
		case *ast.CallExpr:
			if isPkgSel(e.Fun, eg, "WithContext") {
				return true
			}
			if id, ok := ast.Unparen(e.Fun).(*ast.Ident); ok && id.Name == "new" && len(e.Args) == 1 {
				return isGroupType(e.Args[0])
			}
		case *ast.CompositeLit:
			return isGroupType(e.Type)
		case *ast.UnaryExpr:
			if lit, ok := ast.Unparen(e.X).(*ast.CompositeLit); ok && e.Op == token.AND {
				return isGroupType(lit.Type)
			}
		}
		return false
	}

	// collect finds the creations whose nearest enclosing function is
	// the one whose body is root; nested function literals are checked
	// on their own.
	collect := func(root ast.Node) []groupCreation {
		var found []groupCreation
		bound := map[ast.Expr]bool{}
		markBound := func(e ast.Expr) {
			bound[e] = true
			if u, ok := e.(*ast.UnaryExpr); ok {
				bound[ast.Unparen(u.X)] = true // the literal inside &T{}
			}
		}
		bind := func(lhs []ast.Expr, rhs []ast.Expr) {
			switch {
			case len(lhs) == len(rhs):
				for i, r := range rhs {
					if creates(r) {
						markBound(ast.Unparen(r))
						found = append(found, groupCreation{expr: ast.Unparen(r), key: types.ExprString(lhs[i])})
					}
				}
			case len(rhs) == 1 && len(lhs) > 1 && creates(rhs[0]):
				markBound(ast.Unparen(rhs[0]))
				found = append(found, groupCreation{expr: ast.Unparen(rhs[0]), key: types.ExprString(lhs[0])})
			}
		}
		ast.Inspect(root, func(n ast.Node) bool {
			if n != root {
				if _, ok := n.(*ast.FuncLit); ok {
					return false
				}
			}
			switch n := n.(type) {
			case *ast.AssignStmt:
				bind(n.Lhs, n.Rhs)
			case *ast.ValueSpec:
				lhs := make([]ast.Expr, len(n.Names))
				for i, id := range n.Names {
					lhs[i] = id
				}
				if len(n.Values) == 0 && n.Type != nil && isGroupType(n.Type) {
					for _, id := range n.Names {
						bound[id] = true
						found = append(found, groupCreation{expr: id, key: id.Name})
					}
				}
				bind(lhs, n.Values)
			case ast.Expr:
				// Statements are visited before their expressions, so a
				// bound Group is already known here.
				if creates(n) && !bound[n] {
					// Passed on, returned or stored in a literal before
					// any SetLimit could be called on it.
					found = append(found, groupCreation{expr: n})
					markBound(n)
				}
			}
			return true
		})
		return found
	}

	// check reports the creations in the function named name whose body
	// is body.
	check := func(name string, root ast.Node, body ast.Node) {
		creations := collect(root)
		for i, c := range creations {
			pos := fset.Position(c.expr.Pos())
			if c.key == "_" {
				continue
			}
			if c.key == "" {
				out = append(out, finding{pos, fmt.Sprintf("errgroup in %s at %s is not bound to a variable, so it has no SetLimit before Go", name, at(pos))})
				continue
			}
			// The group lives from its creation until the same name is
			// bound to another group in this function.
			end := token.NoPos
			for _, later := range creations[i+1:] {
				if later.key == c.key {
					end = later.expr.Pos()
					break
				}
			}
			var setLimit, firstGo token.Pos
			var negative bool
			if body != nil {
				ast.Inspect(body, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok || call.Pos() < c.expr.End() || (end.IsValid() && call.Pos() >= end) {
						return true
					}
					sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
					if !ok || types.ExprString(sel.X) != c.key {
						return true
					}
					switch sel.Sel.Name {
					case "SetLimit":
						if !setLimit.IsValid() {
							setLimit = call.Pos()
							negative = len(call.Args) == 1 && isNegativeLiteral(call.Args[0])
						}
					case "Go", "TryGo":
						if !firstGo.IsValid() {
							firstGo = call.Pos()
						}
					}
					return true
				})
			}
			switch {
			case !setLimit.IsValid() || (firstGo.IsValid() && firstGo < setLimit):
				out = append(out, finding{pos, fmt.Sprintf("errgroup %s in %s at %s has no SetLimit before Go", c.key, name, at(pos))})
			case negative:
				out = append(out, finding{pos, fmt.Sprintf("errgroup %s in %s at %s has a negative SetLimit, which removes the limit", c.key, name, at(pos))})
			}
		}
	}

	// Every function declaration and function literal, each on its own;
	// package-level variables too, where no function can order SetLimit
	// before Go.
	for _, decl := range f.Decls {
		var name string
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Body == nil {
				continue
			}
			name = funcName(d)
			check(name, d.Body, d.Body)
		case *ast.GenDecl:
			name = "package scope"
			if d.Tok == token.VAR {
				check(name, d, nil)
			}
		}
		lits := 0
		ast.Inspect(decl, func(n ast.Node) bool {
			if lit, ok := n.(*ast.FuncLit); ok {
				lits++
				check(fmt.Sprintf("%s.func%d", name, lits), lit.Body, lit.Body)
			}
			return true
		})
	}
	slices.SortFunc(out, func(a, b finding) int { return a.pos.Offset - b.pos.Offset })
	return out
}

// isNegativeLiteral reports whether e is a literal like -1.
func isNegativeLiteral(e ast.Expr) bool {
	u, ok := ast.Unparen(e).(*ast.UnaryExpr)
	if !ok || u.Op != token.SUB {
		return false
	}
	_, ok = ast.Unparen(u.X).(*ast.BasicLit)
	return ok
}

// funcName names a function declaration as it reads in a stack trace:
// "Serve", "(*App).Serve".
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	recv := fd.Recv.List[0].Type
	if idx, ok := recv.(*ast.IndexExpr); ok {
		recv = idx.X
	}
	if idx, ok := recv.(*ast.IndexListExpr); ok {
		recv = idx.X
	}
	if star, ok := recv.(*ast.StarExpr); ok {
		x := star.X
		if idx, ok := x.(*ast.IndexExpr); ok {
			x = idx.X
		}
		if idx, ok := x.(*ast.IndexListExpr); ok {
			x = idx.X
		}
		return fmt.Sprintf("(*%s).%s", types.ExprString(x), fd.Name.Name)
	}
	return fmt.Sprintf("%s.%s", types.ExprString(recv), fd.Name.Name)
}

// moduleRoot walks up from the working directory to the go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// skipDir reports whether the walk leaves out a directory: generated API
// code, vendored and tool trees, fixtures, and what the go tool ignores.
func skipDir(rel, name string) bool {
	switch {
	case rel == ".":
		return false
	case rel == "api", name == "vendor", name == ".tools", name == "node_modules", name == "testdata":
		return true
	case strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_"):
		return true
	}
	return false
}

// loadModule parses every non-generated Go file of the module.
func loadModule(t *testing.T) []sourceFile {
	t.Helper()
	root := moduleRoot(t)
	var files []sourceFile
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if skipDir(rel, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(d.Name(), ".go") || strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, rel, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parse: %w", err)
		}
		if ast.IsGenerated(f) {
			return nil
		}
		files = append(files, sourceFile{
			rel:  rel,
			dir:  path.Dir(rel),
			test: strings.HasSuffix(rel, "_test.go"),
			fset: fset,
			file: f,
		})
		return nil
	})
	if err != nil {
		t.Fatalf("read module sources: %v", err)
	}
	return files
}

// Tests that the module obeys the structural rules a, b and c.
func TestStructure(t *testing.T) {
	files := loadModule(t)

	// The rules must see the code they guard; an empty or misrooted walk
	// would pass vacuously.
	var sawGuard, sawReadPath bool
	for _, sf := range files {
		if sf.rel == "internal/guard/guard.go" {
			sawGuard = len(findRegistrations(sf.fset, sf.file)) > 0
		}
		if goStrict(sf.dir) && !sf.test {
			sawReadPath = true
		}
	}
	if !sawGuard {
		t.Fatalf("the walk of %d files did not find guard's own registrations in internal/guard/guard.go", len(files))
	}
	if !sawReadPath {
		t.Fatalf("the walk of %d files found no read-path package", len(files))
	}

	t.Run("a/only guard registers services", func(t *testing.T) {
		for _, sf := range files {
			if mayRegister(sf.dir) {
				continue
			}
			for _, f := range findRegistrations(sf.fset, sf.file) {
				t.Error(f)
			}
		}
	})
	t.Run("b/read-path packages start no goroutines", func(t *testing.T) {
		for _, sf := range files {
			if sf.test || !goStrict(sf.dir) {
				continue
			}
			for _, f := range findGoStatements(sf.fset, sf.file) {
				t.Error(f)
			}
		}
	})
	t.Run("c/every errgroup has a limit", func(t *testing.T) {
		for _, sf := range files {
			for _, f := range findUnlimitedErrgroups(sf.fset, sf.file) {
				t.Error(f)
			}
		}
	})
}

// Tests that each detector flags exactly the lines of its fixtures that
// are marked "// want", and nothing in the good fixtures, so that the
// rules are known to be able to fail.
func TestStructureDetectors(t *testing.T) {
	detectors := map[string]func(*token.FileSet, *ast.File) []finding{
		"register": findRegistrations,
		"go":       findGoStatements,
		"errgroup": findUnlimitedErrgroups,
	}
	for _, tc := range []struct {
		file     string
		detector string
		bad      bool
	}{
		{"bad_register.go.txt", "register", true},
		{"good_register.go.txt", "register", false},
		{"bad_go.go.txt", "go", true},
		{"good_go.go.txt", "go", false},
		{"bad_errgroup.go.txt", "errgroup", true},
		{"good_errgroup.go.txt", "errgroup", false},
	} {
		t.Run(tc.file, func(t *testing.T) {
			name := filepath.Join("testdata", "structure", tc.file)
			src, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, name, src, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			want := wantLines(src)
			if tc.bad && len(want) == 0 {
				t.Fatalf("%s marks no line with // want", name)
			}
			if !tc.bad && len(want) > 0 {
				t.Fatalf("good fixture %s marks lines %v with // want", name, want)
			}
			got := map[int]bool{}
			for _, fd := range detectors[tc.detector](fset, f) {
				got[fd.pos.Line] = true
				if !want[fd.pos.Line] {
					t.Errorf("unexpected finding: %s", fd)
				}
			}
			for line := range want {
				if !got[line] {
					t.Errorf("%s:%d: want a finding, got none", name, line)
				}
			}
		})
	}
}

// wantLines returns the line numbers of src that end in "// want".
func wantLines(src []byte) map[int]bool {
	lines := map[int]bool{}
	sc := bufio.NewScanner(bytes.NewReader(src))
	for n := 1; sc.Scan(); n++ {
		if strings.HasSuffix(strings.TrimSpace(sc.Text()), "// want") {
			lines[n] = true
		}
	}
	return lines
}

// Tests which directories the go-statement rule treats as read-path
// packages.
func TestGoStatementScope(t *testing.T) {
	for dir, strict := range map[string]bool{
		"internal/rpc":             true,
		"internal/posts":           true,
		"internal/cache":           true,
		"internal/store":           true,
		"internal/store/boltstore": true,
		"internal/store/storetest": true,
		"internal/aturi":           true,
		"internal/identity":        true,
		"internal/somethingnew":    true,
		"internal/guard/newpart":   true,
		"pkg/client":               true,
		"internal/guard":           false,
		"internal/guard/fanout":    false,
		"internal/app":             false,
		"internal/admin":           false,
		"internal/telemetry":       false,
		"internal/testenv":         false,
		"cmd/sluice":               false,
		"cmd/sluice-load":          false,
	} {
		if got := goStrict(dir); got != strict {
			t.Errorf("goStrict(%q) = %v, want %v", dir, got, strict)
		}
	}
	for dir, may := range map[string]bool{
		"internal/guard":        true,
		"internal/guard/fanout": false,
		"internal/rpc":          false,
		"internal/app":          false,
		"cmd/sluice":            false,
	} {
		if got := mayRegister(dir); got != may {
			t.Errorf("mayRegister(%q) = %v, want %v", dir, got, may)
		}
	}
}

// Tests that the unguarded bare peer, which rule a lets register a
// service, is reachable only from the benchmarks: no package under cmd/,
// internal/ or pkg/ imports it.
func TestNothingServesThePeer(t *testing.T) {
	const peerPath = "github.com/sluice-dev/sluice/" + peerDir
	files := loadModule(t)
	sawPeer := false
	for _, sf := range files {
		if sf.dir == peerDir {
			sawPeer = true
		}
		top, _, _ := strings.Cut(sf.dir, "/")
		if top != "cmd" && top != "internal" && top != "pkg" {
			continue
		}
		for _, imp := range sf.file.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == peerPath || strings.HasPrefix(p, peerPath+"/") {
				t.Errorf("%s imports %s; the bare peer is for benchmarks only", sf.fset.Position(imp.Pos()), p)
			}
		}
	}
	if !sawPeer {
		t.Fatalf("the walk of %d files did not find %s", len(files), peerDir)
	}
}
