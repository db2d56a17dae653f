package structcheck

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/types/typeutil"
)

// groupCheck is the errgroup rule at one listed errgroup site.
type groupCheck struct {
	*pkgCheck
	fi       *funcInfo
	report   bool
	created  map[*types.Var]bool    // groups created and limited here
	bound    map[ast.Expr]bool      // creation expressions bound to one of them
	setLimit map[*ast.CallExpr]bool // the SetLimit right after each creation
}

// checkGroups applies the errgroup rule to a listed site: each group is
// created into a local variable, limited on the very next statement with
// a configured or bounded constant limit, and otherwise only used for Go,
// TryGo and Wait. In test code it only notes whether groups are made.
func (p *pkgCheck) checkGroups(fi *funcInfo, test bool) {
	g := &groupCheck{pkgCheck: p, fi: fi, report: !test, created: map[*types.Var]bool{},
		bound: map[ast.Expr]bool{}, setLimit: map[*ast.CallExpr]bool{}}
	ast.Inspect(fi.decl.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BlockStmt:
			g.statements(n.List)
		case *ast.CaseClause:
			g.statements(n.Body)
		case *ast.CommClause:
			g.statements(n.Body)
		}
		return true
	})
	g.uses(fi.decl.Body)
}

func (g *groupCheck) reportf(pos token.Pos, format string, args ...any) {
	if g.report {
		g.pkgCheck.reportf(pos, "errgroup", format, args...)
	}
}

// statements finds the creations in one statement list and checks the
// statement after each.
func (g *groupCheck) statements(list []ast.Stmt) {
	for i, st := range list {
		v, expr := g.creation(st)
		if v == nil {
			continue
		}
		g.fi.makesGroup = true
		g.created[v] = true
		if expr != nil {
			g.bound[expr] = true
		}
		call := g.setLimitAt(list, i+1, v)
		if call == nil {
			g.reportf(st.Pos(), "errgroup %s in %s has no limit: the statement right after its creation must be %s.SetLimit(n)", v.Name(), g.fi.where(), v.Name())
			continue
		}
		g.setLimit[call] = true
		if why := g.limitProblem(call.Args[0]); why != "" {
			g.reportf(call.Args[0].Pos(), "SetLimit(%s) of errgroup %s in %s: %s", types.ExprString(call.Args[0]), v.Name(), g.fi.where(), why)
		}
	}
}

// creation returns the local variable and creating expression of st when
// st creates an errgroup into a local variable: g := new(errgroup.Group),
// g, ctx := errgroup.WithContext(ctx), g := &errgroup.Group{},
// var g errgroup.Group (expression nil).
func (g *groupCheck) creation(st ast.Stmt) (*types.Var, ast.Expr) {
	var lhs *ast.Ident
	var rhs ast.Expr
	switch st := st.(type) {
	case *ast.AssignStmt:
		if len(st.Rhs) != 1 {
			return nil, nil
		}
		lhs, _ = st.Lhs[0].(*ast.Ident)
		rhs = st.Rhs[0]
	case *ast.DeclStmt:
		gd, ok := st.Decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR || len(gd.Specs) != 1 {
			return nil, nil
		}
		spec := gd.Specs[0].(*ast.ValueSpec)
		if len(spec.Names) != 1 || len(spec.Values) > 1 {
			return nil, nil
		}
		lhs = spec.Names[0]
		if len(spec.Values) == 0 {
			v, _ := g.pass.TypesInfo.Defs[lhs].(*types.Var)
			if v != nil && isGroupValue(v.Type()) {
				return v, nil
			}
			return nil, nil
		}
		rhs = spec.Values[0]
	default:
		return nil, nil
	}
	if lhs == nil {
		return nil, nil
	}
	rhs = ast.Unparen(rhs)
	if u, ok := rhs.(*ast.UnaryExpr); ok && u.Op == token.AND {
		rhs = ast.Unparen(u.X)
	}
	if !g.isCreation(rhs) {
		return nil, nil
	}
	obj := g.pass.TypesInfo.ObjectOf(lhs)
	v, ok := obj.(*types.Var)
	if !ok || v.IsField() || v.Parent() == g.pass.Pkg.Scope() || !isGroup(v.Type()) {
		return nil, nil
	}
	return v, rhs
}

// setLimitAt returns list[i] if it is the statement v.SetLimit(n).
func (g *groupCheck) setLimitAt(list []ast.Stmt, i int, v *types.Var) *ast.CallExpr {
	if i >= len(list) {
		return nil
	}
	es, ok := list[i].(*ast.ExprStmt)
	if !ok {
		return nil
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok || len(call.Args) != 1 {
		return nil
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "SetLimit" {
		return nil
	}
	x, ok := sel.X.(*ast.Ident)
	if !ok || g.pass.TypesInfo.Uses[x] != v {
		return nil
	}
	return call
}

// isCreation reports whether e makes a new errgroup.
func (g *groupCheck) isCreation(e ast.Expr) bool {
	info := g.pass.TypesInfo
	switch e := e.(type) {
	case *ast.CallExpr:
		if fn, ok := typeutil.Callee(info, e).(*types.Func); ok {
			return fn.Pkg() != nil && fn.Pkg().Path() == errgroupPath && fn.Name() == "WithContext"
		}
		if b, ok := typeutil.Callee(info, e).(*types.Builtin); ok && b.Name() == "new" {
			return isGroup(info.TypeOf(e))
		}
	case *ast.CompositeLit:
		return isGroup(info.TypeOf(e))
	}
	return false
}

// uses checks every creation and every use of an errgroup in body.
func (g *groupCheck) uses(body ast.Node) {
	info := g.pass.TypesInfo
	var stack []ast.Node
	ast.Inspect(body, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		parent := ast.Node(nil)
		if len(stack) > 0 {
			parent = stack[len(stack)-1]
		}
		stack = append(stack, n)
		if e, ok := n.(ast.Expr); ok && g.isCreation(e) && !g.bound[e] {
			g.fi.makesGroup = true
			g.reportf(e.Pos(), "errgroup created in %s outside a local variable: create it with g := new(errgroup.Group) or errgroup.WithContext and limit it on the next line", g.fi.where())
		}
		id, ok := n.(*ast.Ident)
		if !ok {
			return true
		}
		v, ok := info.Uses[id].(*types.Var)
		if !ok || !isGroup(v.Type()) {
			return true
		}
		if !g.created[v] {
			g.reportf(id.Pos(), "errgroup %s in %s was not created and limited here (a field, parameter, package variable or copy); create it in this function and SetLimit it on the next line", id.Name, g.fi.where())
			return true
		}
		sel, ok := parent.(*ast.SelectorExpr)
		if !ok || sel.X != id {
			g.reportf(id.Pos(), "errgroup %s in %s leaves its variable; use it only for Go, TryGo and Wait", id.Name, g.fi.where())
			return true
		}
		switch sel.Sel.Name {
		case "Go", "TryGo", "Wait":
		case "SetLimit":
			if call, ok := g.callOf(stack, sel); !ok || !g.setLimit[call] {
				g.reportf(sel.Pos(), "%s.SetLimit in %s: a group's limit is set once, on the statement right after its creation", id.Name, g.fi.where())
			}
		default:
			g.reportf(sel.Pos(), "errgroup %s in %s: use it only for Go, TryGo and Wait", id.Name, g.fi.where())
		}
		return true
	})
}

// callOf returns the call whose function is sel, from the walk's stack
// (which ends with sel's identifier).
func (g *groupCheck) callOf(stack []ast.Node, sel *ast.SelectorExpr) (*ast.CallExpr, bool) {
	if len(stack) < 3 {
		return nil, false
	}
	call, ok := stack[len(stack)-3].(*ast.CallExpr)
	return call, ok && call.Fun == sel
}

// limitProblem says what is wrong with an errgroup limit, or "".
func (g *groupCheck) limitProblem(arg ast.Expr) string {
	if why, isConst := constLimitProblem(g.pass.TypesInfo, arg); isConst {
		return why
	}
	if g.configured(arg) {
		return ""
	}
	return fmt.Sprintf("a limit is a constant from 1 to %d or comes from configuration (a struct field, a module function's result, a parameter of the site, or len, min or max of those), never a local variable or arithmetic", MaxConstLimit)
}

// constLimitProblem reports whether arg is constant and, if so, what is
// wrong with it as a limit.
func constLimitProblem(info *types.Info, arg ast.Expr) (why string, isConst bool) {
	tv := info.Types[arg]
	if tv.Value == nil {
		return "", false
	}
	v, exact := constant.Int64Val(constant.ToInt(tv.Value))
	switch {
	case !exact || v > MaxConstLimit:
		return fmt.Sprintf("the constant %s is over the ceiling of %d, as good as no limit", tv.Value, MaxConstLimit), true
	case v < 0:
		return fmt.Sprintf("the constant %s is negative, which removes the limit", tv.Value), true
	case v == 0:
		return "a limit of 0 lets no task run", true
	}
	return "", true
}

// configured reports whether e is a limit taken from configuration.
func (g *groupCheck) configured(e ast.Expr) bool {
	info := g.pass.TypesInfo
	switch e := ast.Unparen(e).(type) {
	case *ast.SelectorExpr:
		sel := info.Selections[e]
		return sel != nil && sel.Kind() == types.FieldVal
	case *ast.Ident:
		v, ok := info.Uses[e].(*types.Var)
		if i := paramIndex(g.fi, v); ok && i >= 0 {
			g.fi.limitParams[i] = true
			return true
		}
		return false
	case *ast.CallExpr:
		if info.Types[e.Fun].IsType() && len(e.Args) == 1 {
			return g.configured(e.Args[0])
		}
		switch callee := typeutil.Callee(info, e).(type) {
		case *types.Builtin:
			switch callee.Name() {
			case "len", "cap":
				return true
			case "min", "max":
				for _, a := range e.Args {
					if why, isConst := constLimitProblem(info, a); isConst && why != "" || !isConst && !g.configured(a) {
						return false
					}
				}
				return true
			}
		case *types.Func:
			return inModule(callee.Pkg())
		}
	}
	return false
}

// paramIndex returns the index of v among fi's parameters, or -1.
func paramIndex(fi *funcInfo, v *types.Var) int {
	if fi.obj == nil || v == nil {
		return -1
	}
	params := fi.obj.Signature().Params()
	for i := range params.Len() {
		if params.At(i) == v {
			return i
		}
	}
	return -1
}

// isGroup reports whether t is errgroup.Group or *errgroup.Group.
func isGroup(t types.Type) bool {
	if pt, ok := types.Unalias(t).(*types.Pointer); ok {
		t = pt.Elem()
	}
	return isGroupValue(t)
}

func isGroupValue(t types.Type) bool {
	named, ok := types.Unalias(t).(*types.Named)
	return ok && named.Obj().Pkg() != nil && named.Obj().Pkg().Path() == errgroupPath && named.Obj().Name() == "Group"
}
