// Package faults holds sluice's fault-injection suite; it has no code
// outside its tests.
//
// The tests put a real toxiproxy (github.com/Shopify/toxiproxy/v2, run
// in-process on a loopback port and driven through its client package)
// between a real sluice and a real memcached — and, once a network store
// backend exists, between sluice and its store — and inject the failures
// that took down the services this project answers: a cache that refuses
// connections, black-holes packets, answers slowly or resets connections;
// a store that is down, slow, or fails part of a batch. Each scenario runs
// under steady load from named clients and asserts figures (success rate,
// time for the breaker to open, p99 against a no-cache baseline measured
// in the same test, log lines, OS threads, dials, goroutines, recovery
// without a restart). restart_test.go drives the real `sluice serve`
// binary through SIGTERM and SIGKILL; journal_test.go and kill_test.go
// show that no acknowledged write is undone by a frozen memcached or by a
// SIGKILL between the store write and its tombstone.
//
// `make test` runs every scenario with short phases; `make test-faults`
// runs them again with long phases (SLUICE_FAULTS_SOAK=1).
package faults
