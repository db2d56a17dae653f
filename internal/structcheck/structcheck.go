package structcheck

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"slices"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// ModulePath is the module whose packages the rules apply to; packages of
// other modules are only looked up, never reported.
const ModulePath = "github.com/sluice-dev/sluice"

// Analyzer checks the rules of the package doc with the module's own
// allow-list.
var Analyzer = New(Allowed, TestSupport)

// New returns an analyzer of the rules with the given allow-list and
// test-support packages, so tests can run it on fixtures of their own.
func New(allowed map[string]Site, testSupport []string) *analysis.Analyzer {
	c := &config{allowed: allowed, testSupport: testSupport}
	return &analysis.Analyzer{
		Name:      "structcheck",
		Doc:       "sluice's structure rules: only the guard registers services, goroutines start only at listed lifecycle sites, errgroups only at listed sites with a real limit, generated code only from protoc",
		Run:       c.run,
		FactTypes: []analysis.Fact{new(startsFact), new(registersFact), new(limitFact)},
	}
}

type config struct {
	allowed     map[string]Site
	testSupport []string
}

// startsFact marks a module function that starts a goroutine, directly or
// through the functions it calls.
type startsFact struct{ How string }

func (*startsFact) AFact()           {}
func (f *startsFact) String() string { return "starts(" + f.How + ")" }

// registersFact marks a module function that registers a gRPC service,
// directly or through the functions it calls.
type registersFact struct{ How string }

func (*registersFact) AFact()           {}
func (f *registersFact) String() string { return "registers(" + f.How + ")" }

// limitFact marks a module function some of whose parameters become an
// errgroup limit, directly or through the functions it calls, so that a
// constant passed for one is checked like a constant limit.
type limitFact struct{ Params []int }

func (*limitFact) AFact()           {}
func (f *limitFact) String() string { return fmt.Sprintf("limit%v", f.Params) }

// guardDir is the one package that may register services.
const guardDir = "internal/guard"

// relDir returns the directory of the package path relative to the module
// root ("internal/guard"; "." for the root), folding test variants and
// external test packages onto their package, and false outside the module.
func relDir(pkgPath string) (string, bool) {
	if i := strings.IndexByte(pkgPath, ' '); i >= 0 {
		pkgPath = pkgPath[:i]
	}
	if strings.HasSuffix(pkgPath, ".test") {
		return "", false // a test binary's generated main
	}
	pkgPath = strings.TrimSuffix(pkgPath, "_test")
	if pkgPath == ModulePath {
		return ".", true
	}
	rel, ok := strings.CutPrefix(pkgPath, ModulePath+"/")
	return rel, ok
}

func inModule(pkg *types.Package) bool {
	if pkg == nil {
		return false
	}
	_, ok := relDir(pkg.Path())
	return ok
}

// fileKind says how the rules treat one file.
type fileKind int

const (
	handWritten fileKind = iota
	testCode             // a _test.go file or a file of a test-support package
	generated            // protoc output in a generated-code directory
)

// pkgCheck is the state of one package's analysis.
type pkgCheck struct {
	*config
	pass     *analysis.Pass
	rel      string
	kinds    map[*ast.File]fileKind
	reported map[string]bool
	funcs    []*funcInfo
	byObj    map[*types.Func]*funcInfo
}

func (c *config) run(pass *analysis.Pass) (any, error) {
	rel, ok := relDir(pass.Pkg.Path())
	if !ok {
		return nil, nil
	}
	p := &pkgCheck{config: c, pass: pass, rel: rel, kinds: map[*ast.File]fileKind{},
		reported: map[string]bool{}, byObj: map[*types.Func]*funcInfo{}}
	for _, f := range pass.Files {
		p.kinds[f] = p.classify(f)
		p.checkImports(f)
	}
	p.collect()
	p.groups()
	p.propagate()
	p.report()
	p.checkEntries()
	return nil, nil
}

// report emits one diagnostic per rule and line.
func (p *pkgCheck) reportf(pos token.Pos, rule, format string, args ...any) {
	position := p.pass.Fset.Position(pos)
	key := fmt.Sprintf("%s:%d:%s", position.Filename, position.Line, rule)
	if p.reported[key] {
		return
	}
	p.reported[key] = true
	p.pass.Report(analysis.Diagnostic{Pos: pos, Category: rule, Message: rule + ": " + fmt.Sprintf(format, args...)})
}

func (p *pkgCheck) isTestSupport(rel string) bool { return slices.Contains(p.testSupport, rel) }

// isUnguarded reports whether the package has an Unguarded site.
func (p *pkgCheck) isUnguarded(rel string) bool {
	for key, site := range p.allowed {
		if site.Kind == Unguarded && strings.HasPrefix(key, rel+".") && !strings.Contains(key[len(rel)+1:], "/") {
			return true
		}
	}
	return false
}

// classify tells test code, generated code and hand-written code apart,
// and reports hand-written files in the generated-code directories.
func (p *pkgCheck) classify(f *ast.File) fileKind {
	name := p.pass.Fset.File(f.Pos()).Name()
	if generatedDir(p.rel) {
		if why := p.notGenerated(f, name); why != "" {
			p.reportf(f.Package, "generated", "%s is not protoc output (%s); only protoc-gen-go and protoc-gen-go-grpc files from proto/ belong in %s, so move hand-written code to a package of its own", baseName(name), why, p.rel)
		} else {
			return generated
		}
	}
	if strings.HasSuffix(name, "_test.go") || p.isTestSupport(p.rel) {
		return testCode
	}
	return handWritten
}

// checkImports refuses a test-support package imported by code that is
// not test code.
func (p *pkgCheck) checkImports(f *ast.File) {
	if p.kinds[f] == testCode {
		return
	}
	for _, imp := range f.Imports {
		path := strings.Trim(imp.Path.Value, `"`)
		rel, ok := relDir(path)
		if ok && p.isTestSupport(rel) {
			p.reportf(imp.Pos(), "testsupport", "%s is test-support code (it may start goroutines freely); only tests may import it", rel)
		}
		if ok && p.isUnguarded(rel) && p.rel != "bench" && !strings.HasPrefix(p.rel, "bench/") {
			p.reportf(imp.Pos(), "unguarded", "%s is a benchmark baseline, unguarded on purpose; only packages under bench/ may import it", rel)
		}
	}
}

// funcKey names a function as the allow-list does: "(*App).Serve",
// "driver.run", "Each".
func funcKey(fn *types.Func) string {
	recv := fn.Signature().Recv()
	if recv == nil {
		return fn.Name()
	}
	t, ptr := recv.Type(), false
	if pt, ok := t.(*types.Pointer); ok {
		t, ptr = pt.Elem(), true
	}
	name := "?"
	if named, ok := types.Unalias(t).(*types.Named); ok {
		name = named.Obj().Name()
	}
	if ptr {
		return fmt.Sprintf("(*%s).%s", name, fn.Name())
	}
	return name + "." + fn.Name()
}

// qualified names a module function for messages: "internal/app.Spawn".
func qualified(fn *types.Func) string {
	rel, _ := relDir(fn.Pkg().Path())
	return rel + "." + funcKey(fn)
}

// underAny reports whether the directory rel is one of dirs or lies below one.
func underAny(rel string, dirs []string) bool {
	for _, d := range dirs {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}

func baseName(path string) string { return path[strings.LastIndexAny(path, `/\`)+1:] }

// checkEntries reports allow-list entries of this package that name no
// function, or a function that no longer does what the entry allows.
func (p *pkgCheck) checkEntries() {
	if strings.HasSuffix(p.pass.Pkg.Path(), "_test") || len(p.pass.Files) == 0 {
		return
	}
	for key, site := range p.allowed {
		rest, ok := strings.CutPrefix(key, p.rel+".")
		if !ok || strings.Contains(rest, "/") {
			continue
		}
		var fi *funcInfo
		for _, f := range p.funcs {
			if f.key == key {
				fi = f
			}
		}
		switch {
		case fi == nil:
			p.reportf(p.pass.Files[0].Package, "allowlist", "entry %q names no function of this package; remove or rename it", key)
		case site.Kind == ErrgroupSite && !underAny(p.rel, ErrgroupDirs):
			p.reportf(fi.decl.Pos(), "allowlist", "entry %q lists an errgroup site in a server package; on the server, fan out through fanout.Each, under the method's policy", key)
		case site.Kind == Unguarded && fi.startsDirect == "" && fi.regDirect == "" && !fi.makesGroup:
			p.reportf(fi.decl.Pos(), "allowlist", "entry %q is unguarded but %s registers nothing and starts nothing; remove the entry", key, fi.decl.Name.Name)
		case site.Kind == Unguarded:
		case site.Kind == ErrgroupSite && !fi.makesGroup:
			p.reportf(fi.decl.Pos(), "allowlist", "entry %q is an errgroup site but %s creates no errgroup; remove the entry", key, fi.decl.Name.Name)
		case site.Kind != ErrgroupSite && fi.startsDirect == "":
			p.reportf(fi.decl.Pos(), "allowlist", "entry %q allows goroutines but %s starts none; remove the entry", key, fi.decl.Name.Name)
		}
	}
}
