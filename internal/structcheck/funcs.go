package structcheck

import (
	"go/ast"
	"go/token"
	"go/types"
	"strings"
)

// funcInfo is one top-level declaration of the package: a function or
// method (obj set), or a package-level declaration (obj nil), whose
// function literals belong to it.
type funcInfo struct {
	decl *ast.FuncDecl // nil for a package-level declaration
	node ast.Node
	file *ast.File
	obj  *types.Func
	key  string // allow-list key, for functions
	site *Site  // its allow-list entry, if any

	events       []event
	startsDirect string // the first goroutine it starts itself
	regDirect    string // the first registration it makes itself
	makesGroup   bool   // it creates an errgroup

	starts      *startsFact
	registers   *registersFact
	limitParams map[int]bool // parameters that become an errgroup limit
}

type eventKind int

const (
	evStart      eventKind = iota // a goroutine start
	evErrgroupGo                  // (*errgroup.Group).Go or TryGo
	evRegister                    // a registration primitive
	evRef                         // a reference to a module function
	evErrgroup                    // a reference to package errgroup
)

type event struct {
	kind   eventKind
	pos    token.Pos
	desc   string
	callee *types.Func // for evRef
}

// collect records every declaration's events.
func (p *pkgCheck) collect() {
	for _, f := range p.pass.Files {
		for _, decl := range f.Decls {
			fi := &funcInfo{node: decl, file: f, limitParams: map[int]bool{}}
			if fd, ok := decl.(*ast.FuncDecl); ok {
				if fd.Body == nil {
					continue
				}
				fi.decl = fd
				fi.obj, _ = p.pass.TypesInfo.Defs[fd.Name].(*types.Func)
				if fi.obj != nil {
					fi.key = p.rel + "." + funcKey(fi.obj)
					if s, ok := p.allowed[fi.key]; ok {
						fi.site = &s
					}
					p.byObj[fi.obj] = fi
				}
			}
			p.events(fi)
			p.funcs = append(p.funcs, fi)
		}
	}
}

// events walks one declaration for goroutine starts, registrations,
// references to module functions and uses of package errgroup.
func (p *pkgCheck) events(fi *funcInfo) {
	info := p.pass.TypesInfo
	add := func(kind eventKind, pos token.Pos, desc string, callee *types.Func) {
		fi.events = append(fi.events, event{kind, pos, desc, callee})
		switch {
		case (kind == evStart || kind == evErrgroupGo) && fi.startsDirect == "":
			fi.startsDirect = desc
		case kind == evRegister && fi.regDirect == "":
			fi.regDirect = desc
		}
	}
	// What only holds or names a *grpc.Server is noted after the walk, so
	// a line's diagnostic names the registration primitive when it has one.
	var held []event
	ast.Inspect(fi.node, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			add(evStart, n.Pos(), "go statement", nil)
		case *ast.CallExpr:
			if name := reflectRegistration(info, n); name != "" {
				add(evRegister, n.Pos(), "reflect lookup of "+name, nil)
			}
		case *ast.Ident:
			p.identEvents(n, add)
			if obj, ok := info.Uses[n].(*types.TypeName); ok && obj.Pkg() != nil && obj.Pkg().Path() == grpcPath && obj.Name() == "Server" {
				held = append(held, event{evRegister, n.Pos(), "grpc.Server", nil})
			}
		}
		if e, ok := n.(ast.Expr); ok {
			if tv, ok := info.Types[e]; ok && !tv.IsType() && isGRPCServer(tv.Type) {
				held = append(held, event{evRegister, e.Pos(), "a *grpc.Server value", nil})
			}
		}
		return true
	})
	for _, ev := range held {
		add(ev.kind, ev.pos, ev.desc, nil)
	}
}

// identEvents classifies what one identifier refers to.
func (p *pkgCheck) identEvents(id *ast.Ident, add func(eventKind, token.Pos, string, *types.Func)) {
	switch obj := p.pass.TypesInfo.Uses[id].(type) {
	case *types.Func:
		fn := obj.Origin()
		if desc, group := goroutinePrimitive(fn); group {
			add(evErrgroupGo, id.Pos(), desc, nil)
		} else if desc != "" {
			add(evStart, id.Pos(), desc, nil)
		}
		if desc := registrationPrimitive(fn); desc != "" {
			add(evRegister, id.Pos(), desc, nil)
		}
		if inModule(fn.Pkg()) {
			add(evRef, id.Pos(), "", fn)
		}
		if fn.Pkg() != nil && fn.Pkg().Path() == errgroupPath {
			add(evErrgroup, id.Pos(), "errgroup."+funcKey(fn), nil)
		}
	case *types.TypeName:
		if obj.Pkg() == nil {
			return
		}
		if obj.Pkg().Path() == errgroupPath {
			add(evErrgroup, id.Pos(), "errgroup."+obj.Name(), nil)
		}
	}
}

// propagate gives each function its facts: what it does itself, or what
// a module function it refers to does, until nothing changes; then exports
// them for the packages that import this one.
func (p *pkgCheck) propagate() {
	for _, fi := range p.funcs {
		if fi.obj == nil {
			continue
		}
		if fi.startsDirect != "" && p.carriesStarts(fi) {
			fi.starts = &startsFact{How: fi.startsDirect + " in " + qualified(fi.obj)}
		}
		if fi.regDirect != "" && p.carriesRegisters(fi) {
			fi.registers = &registersFact{How: fi.regDirect + " in " + qualified(fi.obj)}
		}
	}
	for changed := true; changed; {
		changed = false
		for _, fi := range p.funcs {
			if fi.obj == nil {
				continue
			}
			for _, ev := range fi.events {
				if ev.kind != evRef {
					continue
				}
				if fi.starts == nil && p.carriesStarts(fi) {
					if sf := p.startsOf(ev.callee); sf != nil {
						fi.starts, changed = &startsFact{How: sf.How}, true
					}
				}
				if fi.registers == nil && p.carriesRegisters(fi) {
					if rf := p.registersOf(ev.callee); rf != nil {
						fi.registers, changed = &registersFact{How: rf.How}, true
					}
				}
			}
		}
	}
	p.propagateLimits()
	for _, fi := range p.funcs {
		if p.inTestFile(fi) {
			continue // nothing outside the test binary can call it
		}
		if fi.starts != nil {
			p.pass.ExportObjectFact(fi.obj, fi.starts)
		}
		if fi.registers != nil {
			p.pass.ExportObjectFact(fi.obj, fi.registers)
		}
	}
}

func (p *pkgCheck) inTestFile(fi *funcInfo) bool {
	return strings.HasSuffix(p.pass.Fset.File(fi.file.Pos()).Name(), "_test.go")
}

// carriesStarts reports whether a function that starts goroutines passes
// that on to its callers: every function does but the lifecycle and
// errgroup sites of the allow-list.
func (p *pkgCheck) carriesStarts(fi *funcInfo) bool {
	return fi.site == nil || fi.site.Kind == Spawner
}

// carriesRegisters reports whether a function that registers passes that
// on: every function does but the guard's and the unguarded sites.
func (p *pkgCheck) carriesRegisters(fi *funcInfo) bool {
	return p.rel != guardDir && (fi.site == nil || fi.site.Kind != Unguarded)
}

// mayRegister reports whether registering is allowed in fi.
func (p *pkgCheck) mayRegister(fi *funcInfo) bool {
	return p.rel == guardDir || fi.site != nil && fi.site.Kind == Unguarded
}

func (p *pkgCheck) startsOf(fn *types.Func) *startsFact {
	if fi := p.byObj[fn]; fi != nil {
		return fi.starts
	}
	var f startsFact
	if p.pass.ImportObjectFact(fn, &f) {
		return &f
	}
	return nil
}

func (p *pkgCheck) registersOf(fn *types.Func) *registersFact {
	if fi := p.byObj[fn]; fi != nil {
		return fi.registers
	}
	var f registersFact
	if p.pass.ImportObjectFact(fn, &f) {
		return &f
	}
	return nil
}

// where names the declaration for messages.
func (fi *funcInfo) where() string {
	if fi.obj == nil {
		return "a package-level declaration"
	}
	return qualified(fi.obj)
}

// report turns the events of every declaration into diagnostics.
func (p *pkgCheck) report() {
	for _, fi := range p.funcs {
		kind := p.kinds[fi.file]
		if kind == generated {
			continue
		}
		for _, ev := range fi.events {
			p.reportEvent(fi, kind, ev)
		}
		if kind != testCode {
			p.checkLimitArgs(fi)
		}
	}
}

// groups applies the errgroup rule to every listed errgroup site, noting
// which of their parameters become limits.
func (p *pkgCheck) groups() {
	for _, fi := range p.funcs {
		if kind := p.kinds[fi.file]; kind != generated && fi.site != nil && (fi.site.Kind == ErrgroupSite || fi.site.Kind == Unguarded) {
			p.checkGroups(fi, kind == testCode)
		}
	}
}

func (p *pkgCheck) reportEvent(fi *funcInfo, kind fileKind, ev event) {
	site := fi.site
	switch ev.kind {
	case evRegister:
		if !p.mayRegister(fi) {
			p.reportf(ev.pos, "register", "%s in %s; only internal/guard registers services, through guard.Server.Register, which requires a policy for every method", ev.desc, fi.where())
		}
	case evRef:
		if rf := p.registersOf(ev.callee); rf != nil && !p.mayRegister(fi) {
			p.reportf(ev.pos, "register", "%s registers a gRPC service (%s); only internal/guard registers services, through guard.Server.Register", qualified(ev.callee), rf.How)
		}
		sf := p.startsOf(ev.callee)
		if sf == nil || kind == testCode {
			return
		}
		calleeRel, _ := relDir(ev.callee.Pkg().Path())
		calleeSite, listed := p.allowed[qualified(ev.callee)]
		if spawner := listed && calleeSite.Kind == Spawner; spawner && calleeRel != p.rel || !spawner && site == nil {
			p.reportf(ev.pos, "goroutine", "%s starts a goroutine (%s), and %s is not a listed lifecycle site; run request work through fanout.Each, or list the site in internal/structcheck/allow.go with its reason", qualified(ev.callee), sf.How, fi.where())
		}
	case evStart, evErrgroupGo:
		if kind == testCode {
			return
		}
		if site == nil || site.Kind == ErrgroupSite && ev.kind == evStart {
			p.reportf(ev.pos, "goroutine", "%s in %s starts a goroutine outside the listed lifecycle sites; run request work through fanout.Each, or list the site in internal/structcheck/allow.go with its reason", ev.desc, fi.where())
		}
	case evErrgroup:
		if kind == testCode || site != nil && (site.Kind == ErrgroupSite || site.Kind == Unguarded) {
			return
		}
		p.reportf(ev.pos, "errgroup", "%s in %s: errgroups exist only at listed fan-out sites (on the server, fanout.Each); use fanout.Each, or list a client-side site in internal/structcheck/allow.go", ev.desc, fi.where())
	}
}
