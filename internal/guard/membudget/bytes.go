package membudget

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Bytes is a size in bytes that config files and flags write with IEC
// units: "512MiB", "2GiB", "64KiB", or a plain number of bytes.
type Bytes int64

// IEC units, the only suffixes ParseBytes accepts. Decimal units (MB, GB)
// are refused rather than guessed at: a budget off by 5 % is a budget
// that does not hold.
const (
	KiB Bytes = 1 << 10
	MiB Bytes = 1 << 20
	GiB Bytes = 1 << 30
	TiB Bytes = 1 << 40
)

var units = []struct {
	suffix string
	size   Bytes
}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}, {"B", 1}}

// ParseBytes reads a size such as "512MiB" or "1048576".
func ParseBytes(s string) (Bytes, error) {
	t := strings.TrimSpace(s)
	mult := Bytes(1)
	for _, u := range units {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(num), u.size
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a whole number of bytes with an optional IEC unit (KiB, MiB, GiB, TiB), e.g. 512MiB", s)
	}
	if n > int64(^uint64(0)>>1)/int64(mult) {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return Bytes(n) * mult, nil
}

// String writes b with the largest IEC unit that divides it.
func (b Bytes) String() string {
	for _, u := range units[:4] {
		if b != 0 && b%u.size == 0 && (u.size > KiB || b < 10*MiB) {
			return strconv.FormatInt(int64(b/u.size), 10) + u.suffix
		}
	}
	if b >= 10*MiB {
		return fmt.Sprintf("%.1fMiB", float64(b)/float64(MiB))
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// Set implements flag.Value.
func (b *Bytes) Set(s string) error {
	v, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// UnmarshalYAML accepts "512MiB" as well as a plain integer.
func (b *Bytes) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseBytes(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = v
	return nil
}
