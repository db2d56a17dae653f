package cache

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"
)

// Tests that the package, tests included, starts no goroutines of its own
// and does not import errgroup: all parallel work goes through
// fanout.Each, under the request's limit.
func TestNoUnboundedParallelism(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("list sources: %v (%d files)", err, len(files))
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		for _, imp := range f.Imports {
			if path, _ := strconv.Unquote(imp.Path.Value); path == "golang.org/x/sync/errgroup" {
				t.Errorf("%s imports errgroup; use fanout.Each", fset.Position(imp.Pos()))
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				t.Errorf("%s: go statement; use fanout.Each", fset.Position(g.Pos()))
			}
			return true
		})
	}
}
