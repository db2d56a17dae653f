// Binary sluice-vet checks sluice's structure rules (see package
// internal/structcheck) as a go vet tool:
//
//	go build -o .tools/bin/sluice-vet ./cmd/sluice-vet
//	go vet -vettool=.tools/bin/sluice-vet ./...
//
// make vet runs it on the whole module.
package main

import (
	"golang.org/x/tools/go/analysis/unitchecker"

	"github.com/sluice-dev/sluice/internal/structcheck"
)

func main() { unitchecker.Main(structcheck.Analyzer) }
