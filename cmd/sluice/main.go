// Binary sluice serves post records over gRPC through a bounded memcached
// pool in front of a record store, and carries the admin verbs that
// prepare one: seed and migrate.
//
//	sluice serve   [flags]   serve gRPC and the admin HTTP endpoints
//	sluice seed    [flags]   write synthetic posts into the store
//	sluice migrate [flags]   create or upgrade the CQL keyspace and tables
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := exitCode(run(ctx, os.Args[1:]))
	stop()
	os.Exit(code)
}

// errUsage is a command line that names no verb or an unknown one.
var errUsage = errors.New("usage")

// exitCode is 0 on success and when help was asked for (-h or --help on
// any verb, or the help verb), 2 after a usage mistake (with the usage
// printed), and 1 after any other failure, which it prints.
func exitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "sluice: %v\n%s\n", err, usage)
		return 2
	}
	fmt.Fprintln(os.Stderr, "sluice:", err)
	return 1
}

const usage = `usage: sluice <verb> [flags]

verbs:
  serve   serve gRPC (default 127.0.0.1:50051) and admin HTTP (default 127.0.0.1:8080)
  seed    write synthetic posts into the store and their URIs to a file
  migrate create or upgrade the CQL schema (keyspace, tables); a no-op when current

Run "sluice <verb> -h" for a verb's flags.`

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no verb", errUsage)
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:])
	case "seed":
		return seed(ctx, args[1:])
	case "migrate":
		return migrate(ctx, args[1:], os.Stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(os.Stderr, usage)
		return nil
	}
	return fmt.Errorf("%w: unknown verb %q", errUsage, args[0])
}

// parseFlags parses a verb's flags and refuses any word left after them:
// the flag package stops at the first argument that is not a flag, so the
// flags after a stray word (a second address after a space instead of a
// comma) would otherwise be dropped without a word.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: %s: unexpected argument %q (the flags after it were not read; lists are comma-separated)", errUsage, fs.Name(), fs.Arg(0))
	}
	return nil
}
