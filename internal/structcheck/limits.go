package structcheck

import (
	"go/ast"
	"go/types"
	"slices"

	"golang.org/x/tools/go/types/typeutil"
)

// limitCalls calls fn for every call in fi to a function some of whose
// parameters become an errgroup limit, with the argument and its index.
func (p *pkgCheck) limitCalls(fi *funcInfo, fn func(callee *types.Func, i int, arg ast.Expr)) {
	ast.Inspect(fi.node, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		callee := typeutil.StaticCallee(p.pass.TypesInfo, call)
		if callee == nil || !inModule(callee.Pkg()) {
			return true
		}
		callee = callee.Origin()
		for _, i := range p.limitParamsOf(callee) {
			if i < len(call.Args) && (i < callee.Signature().Params().Len()-1 || !callee.Signature().Variadic()) {
				fn(callee, i, call.Args[i])
			}
		}
		return true
	})
}

func (p *pkgCheck) limitParamsOf(fn *types.Func) []int {
	if fi := p.byObj[fn]; fi != nil {
		return sortedKeys(fi.limitParams)
	}
	var f limitFact
	if p.pass.ImportObjectFact(fn, &f) {
		return f.Params
	}
	return nil
}

// propagateLimits passes limit parameters up through callers that hand
// their own parameter on, then exports them.
func (p *pkgCheck) propagateLimits() {
	for changed := true; changed; {
		changed = false
		for _, fi := range p.funcs {
			p.limitCalls(fi, func(_ *types.Func, _ int, arg ast.Expr) {
				id, ok := ast.Unparen(arg).(*ast.Ident)
				if !ok {
					return
				}
				v, _ := p.pass.TypesInfo.Uses[id].(*types.Var)
				if i := paramIndex(fi, v); i >= 0 && !fi.limitParams[i] {
					fi.limitParams[i], changed = true, true
				}
			})
		}
	}
	for _, fi := range p.funcs {
		if fi.obj != nil && len(fi.limitParams) > 0 && !p.inTestFile(fi) {
			p.pass.ExportObjectFact(fi.obj, &limitFact{Params: sortedKeys(fi.limitParams)})
		}
	}
}

// checkLimitArgs refuses a constant passed for a parameter that becomes
// an errgroup limit when it would be refused as the limit itself.
func (p *pkgCheck) checkLimitArgs(fi *funcInfo) {
	p.limitCalls(fi, func(callee *types.Func, i int, arg ast.Expr) {
		if why, isConst := constLimitProblem(p.pass.TypesInfo, arg); isConst && why != "" {
			p.reportf(arg.Pos(), "errgroup", "argument %s of %s becomes an errgroup limit (parameter %s): %s", types.ExprString(arg), qualified(callee), callee.Signature().Params().At(i).Name(), why)
		}
	})
}

func sortedKeys(m map[int]bool) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
