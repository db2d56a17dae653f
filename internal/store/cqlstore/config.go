package cqlstore

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/gocql/gocql"

	"github.com/sluice-dev/sluice/internal/store"
)

// Defaults of Config. The timeouts sit a little above Cassandra's and
// Scylla's own (read_request_timeout 5 s, write_request_timeout 2 s), so the
// server answers with its timeout error before the client gives up on the
// connection, and the request's deadline usually ends a query first anyway.
const (
	DefaultKeyspace          = "sluice"
	DefaultDC                = "datacenter1"
	DefaultReadConsistency   = "LOCAL_ONE"
	DefaultWriteConsistency  = "LOCAL_QUORUM"
	DefaultMaxInflight       = 256
	DefaultTimeout           = 6 * time.Second
	DefaultConnectTimeout    = 5 * time.Second
	DefaultRetries           = 2
	DefaultNumConns          = 2
	DefaultReconnectInterval = 2 * time.Second
	DefaultReadGroup         = 20
	DefaultSpeculativeDelay  = 250 * time.Millisecond

	// MaxInflightCeiling is the largest MaxInflight Validate accepts: one
	// process holding more CQL queries open than this is a bug, not a
	// configuration.
	MaxInflightCeiling = 65536
	// MaxRetriesCeiling bounds the retry policy.
	MaxRetriesCeiling = 10
	// MaxReadGroup bounds ReadGroup: Scylla refuses a query restricting
	// more partition keys than max_partition_key_restrictions_per_query
	// (100 by default).
	MaxReadGroup = 100
)

// Config selects and tunes the CQL store. It is a plain value: the zero
// value has no hosts (the CQL store is off) and DefaultConfig fills the
// rest; flags and tests change fields, then Validate checks them once.
type Config struct {
	// Hosts are contact points, host or host:port (port 9042 if absent).
	// Empty means the CQL store is not used.
	Hosts []string
	// Keyspace holds the records and schema_migrations tables.
	Keyspace string
	// DC is the local datacenter: queries go to its replicas first, and
	// LOCAL_* consistency levels count only its replicas.
	DC string
	// ReadConsistency is used for Get: LOCAL_ONE by default, since a read
	// fills a cache whose entries expire anyway.
	ReadConsistency string
	// WriteConsistency is used for Put and Delete (and the existence
	// check Delete makes): LOCAL_QUORUM by default, so a later
	// LOCAL_QUORUM read sees the write.
	WriteConsistency string
	// MaxInflight bounds CQL queries in flight across the process; a query
	// waits for a slot until its context ends.
	MaxInflight int
	// Timeout bounds one query attempt on a connection.
	Timeout time.Duration
	// ConnectTimeout bounds dialing and the CQL handshake.
	ConnectTimeout time.Duration
	// Retries is how many times an idempotent statement is retried, with
	// exponential backoff, after a transport or server error. Every
	// statement this package sends is idempotent (writes carry a fixed
	// client timestamp), so a retry never applies a write twice.
	Retries int
	// NumConns is the number of connections per host (per shard on
	// Scylla's shard-aware driver, which ignores it).
	NumConns int
	// ReconnectInterval is how often a host marked down is dialed again.
	ReconnectInterval time.Duration
	// SpeculativeDelay is how long a statement waits for its first node
	// before the driver sends one more attempt to the next node of its
	// query plan (another replica, or a node already tried when no other
	// is live), taking whichever answers first: a node
	// that is shutting down, paused or overloaded then costs this delay
	// instead of the request's whole deadline. Every statement is
	// idempotent, so a second attempt is safe; it runs inside its query's
	// slot, so the cluster sees at most twice MaxInflight attempts. 0 turns
	// speculation off.
	SpeculativeDelay time.Duration
	// ReadGroup is how many partitions one SELECT of a batch read asks
	// for (GetMany: WHERE uri IN ?). 1 reads each URI with its own
	// SELECT. At most MaxReadGroup.
	ReadGroup int
	// AddressMap maps the address a node advertises (its rpc_address and
	// the native port, "ip:port") to the address this process must dial
	// instead ("ip:port"): for a proxy or NAT between sluice and the
	// cluster. Hosts are then the reachable addresses. The driver keeps
	// discovering nodes and routing by token; it only dials the mapped
	// address. Nodes not in the map are dialed as advertised.
	AddressMap map[string]string

	// JournalRetention is how long invalidation journal rows live (their
	// TTL). Default store.DefaultJournalRetention; at least a minute, so
	// the rows outlive one journal bucket.
	JournalRetention time.Duration
	// JournalOrigin names this writer in the journal rows it writes
	// (store.Change.Origin). Not settable by flags: the server picks one
	// per process.
	JournalOrigin string

	// QueryObserver, when set, sees every query attempt (tests count
	// concurrency with it). Not settable by flags.
	QueryObserver gocql.QueryObserver
	// Log receives the driver's log lines, at most one a second; nil
	// means slog.Default().
	Log *slog.Logger
}

// DefaultConfig returns the defaults, with no hosts.
func DefaultConfig() Config {
	return Config{
		Keyspace:          DefaultKeyspace,
		DC:                DefaultDC,
		ReadConsistency:   DefaultReadConsistency,
		WriteConsistency:  DefaultWriteConsistency,
		MaxInflight:       DefaultMaxInflight,
		Timeout:           DefaultTimeout,
		ConnectTimeout:    DefaultConnectTimeout,
		Retries:           DefaultRetries,
		NumConns:          DefaultNumConns,
		ReconnectInterval: DefaultReconnectInterval,
		SpeculativeDelay:  DefaultSpeculativeDelay,
		ReadGroup:         DefaultReadGroup,
		JournalRetention:  store.DefaultJournalRetention,
	}
}

// Enabled reports whether the config names any host.
func (c Config) Enabled() bool { return len(c.Hosts) > 0 }

// RegisterFlags adds the --cql-* flags to fs; they write into c, which
// should hold the defaults first.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Func("cql-hosts", "CQL contact points (Scylla or Cassandra), comma-separated host[:port]; set to use the CQL store instead of the embedded one", func(s string) error {
		c.Hosts = splitList(s)
		return nil
	})
	fs.StringVar(&c.Keyspace, "cql-keyspace", c.Keyspace, "CQL keyspace holding the records (create it with sluice migrate)")
	fs.StringVar(&c.DC, "cql-dc", c.DC, "local datacenter: token-aware routing prefers its replicas")
	fs.StringVar(&c.ReadConsistency, "cql-read-consistency", c.ReadConsistency, "consistency of reads (cache fills)")
	fs.StringVar(&c.WriteConsistency, "cql-write-consistency", c.WriteConsistency, "consistency of writes and deletes")
	fs.IntVar(&c.MaxInflight, "cql-max-inflight", c.MaxInflight, "process-wide cap on CQL queries in flight; more wait until their deadline")
	fs.DurationVar(&c.Timeout, "cql-timeout", c.Timeout, "per-attempt query timeout (a little above the server's own)")
	fs.IntVar(&c.Retries, "cql-retries", c.Retries, "retries of an idempotent statement after a transport or server error")
	fs.DurationVar(&c.SpeculativeDelay, "cql-speculative-delay", c.SpeculativeDelay, "send a second attempt to another node (the same one when no other is live) when the first has not answered within this delay (0: off)")
	fs.IntVar(&c.ReadGroup, "cql-read-group", c.ReadGroup, fmt.Sprintf("partitions per SELECT of a batch read (WHERE uri IN ?); a group's partitions share a primary replica, which it is sent to; 1 reads each URI with its own token-routed SELECT (1-%d)", MaxReadGroup))
	fs.Func("cql-address-map", "for a proxy or NAT: comma-separated advertised=reachable pairs of ip:port; the driver dials the reachable address of each node it discovers", func(s string) error {
		m, err := parseAddressMap(s)
		c.AddressMap = m
		return err
	})
}

// Validate reports every field out of range.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	var errs []error
	if err := checkIdentifier(c.Keyspace); err != nil {
		errs = append(errs, fmt.Errorf("cql: keyspace: %w", err))
	}
	if c.DC == "" {
		errs = append(errs, errors.New("cql: dc is empty; name the local datacenter (Cassandra's SimpleSnitch calls it datacenter1)"))
	}
	for _, cl := range []struct{ name, v string }{{"read", c.ReadConsistency}, {"write", c.WriteConsistency}} {
		if _, err := parseConsistency(cl.v); err != nil {
			errs = append(errs, fmt.Errorf("cql: %s consistency: %w", cl.name, err))
		}
	}
	if c.MaxInflight < 1 || c.MaxInflight > MaxInflightCeiling {
		errs = append(errs, fmt.Errorf("cql: max inflight %d is outside [1, %d]", c.MaxInflight, MaxInflightCeiling))
	}
	if c.Retries < 0 || c.Retries > MaxRetriesCeiling {
		errs = append(errs, fmt.Errorf("cql: retries %d is outside [0, %d]", c.Retries, MaxRetriesCeiling))
	}
	if c.NumConns < 1 {
		errs = append(errs, fmt.Errorf("cql: connections per host %d is below 1", c.NumConns))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"timeout", c.Timeout}, {"connect timeout", c.ConnectTimeout}, {"reconnect interval", c.ReconnectInterval}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("cql: %s %v must be positive", d.name, d.v))
		}
	}
	if c.ReadGroup < 1 || c.ReadGroup > MaxReadGroup {
		errs = append(errs, fmt.Errorf("cql: read group %d is outside [1, %d]", c.ReadGroup, MaxReadGroup))
	}
	if c.SpeculativeDelay < 0 || c.SpeculativeDelay >= c.Timeout {
		errs = append(errs, fmt.Errorf("cql: speculative delay %v is outside [0, the query timeout %v)", c.SpeculativeDelay, c.Timeout))
	}
	if _, err := c.addressTranslator(); err != nil {
		errs = append(errs, err)
	}
	if c.JournalRetention < journalBucketWidth || c.JournalRetention > maxJournalRetention {
		errs = append(errs, fmt.Errorf("cql: journal retention %v is outside [%v, %v]", c.JournalRetention, journalBucketWidth, maxJournalRetention))
	}
	return errors.Join(errs...)
}

// consistencies are the levels a point read or write may use. SERIAL
// levels are for lightweight transactions, which this package never sends;
// ANY is for writes only, and the write session also reads (Delete's
// existence check, the journal).
var consistencies = map[string]gocql.Consistency{
	"ONE": gocql.One, "TWO": gocql.Two, "THREE": gocql.Three,
	"QUORUM": gocql.Quorum, "ALL": gocql.All, "LOCAL_QUORUM": gocql.LocalQuorum,
	"EACH_QUORUM": gocql.EachQuorum, "LOCAL_ONE": gocql.LocalOne,
}

func parseConsistency(s string) (gocql.Consistency, error) {
	if c, ok := consistencies[strings.ToUpper(s)]; ok {
		return c, nil
	}
	return 0, fmt.Errorf("unknown level %q; use LOCAL_ONE, LOCAL_QUORUM, ONE, QUORUM, EACH_QUORUM or ALL", s)
}

// maxIdentifier is Cassandra's limit on keyspace and table names.
const maxIdentifier = 48

// checkIdentifier accepts unquoted CQL names: a letter, then letters,
// digits and underscores, at most 48 in all.
func checkIdentifier(s string) error {
	if s == "" || len(s) > maxIdentifier {
		return fmt.Errorf("%q must be 1 to %d characters", s, maxIdentifier)
	}
	for i, r := range s {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !letter && (i == 0 || r != '_' && (r < '0' || r > '9')) {
			return fmt.Errorf("%q must start with a letter and hold only letters, digits and _", s)
		}
	}
	return nil
}

// cluster returns the driver config of one session at consistency cl. Each
// session needs its own host policy: gocql refuses to share one.
// hostPolicy routes each query to a replica of its partition in the local
// datacenter.
func (c Config) hostPolicy() gocql.HostSelectionPolicy {
	return gocql.TokenAwareHostPolicy(gocql.DCAwareRoundRobinPolicy(c.DC), gocql.ShuffleReplicas())
}

func (c Config) cluster(cl gocql.Consistency, s sessionOf) *gocql.ClusterConfig {
	cc := gocql.NewCluster(c.Hosts...)
	cc.Keyspace = c.Keyspace
	cc.Consistency = cl
	cc.PoolConfig.HostSelectionPolicy = watchedPolicy{HostSelectionPolicy: c.hostPolicy(), order: s.order, view: s.view, session: s.role, rounds: c.replayRounds()}
	cc.Timeout = c.Timeout
	cc.ConnectTimeout = c.ConnectTimeout
	cc.NumConns = c.NumConns
	cc.ReconnectInterval = c.ReconnectInterval
	if t, _ := c.addressTranslator(); t != nil {
		cc.AddressTranslator = t
	}
	cc.QueryObserver = observer{t: s.counts, next: c.QueryObserver}
	cc.Logger = newDriverLogger(c.Log)
	// No retries by default: only idempotent statements get the policy.
	cc.RetryPolicy = nil
	return cc
}

// replayRounds is how many passes over the live nodes an idempotent
// statement's attempts may make (speculation.go): one for the first
// attempt and each retry, one for the speculative attempt.
func (c Config) replayRounds() int { return c.Retries + 2 }

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
