package plan

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/host"
)

// Action is the first column of a plan line.
type Action byte

// Plan line actions.
const (
	Add        Action = '+'
	Change     Action = '~'
	Remove     Action = '-'
	NotApplied Action = '!' // a conflict, a failure, a pending or skipped object
)

// Subsystem names, as status and metrics know them.
const (
	Nftables  = "nftables"
	Links     = "links"
	WireGuard = "wireguard"
	Sysctls   = "sysctls"
	Routes    = "routes"
)

// Object kinds, as drift metrics count them.
const (
	KindLink          = "link"
	KindAddress       = "address"
	KindRoute         = "route"
	KindRule          = "rule"
	KindFile          = "file"
	KindNftables      = "nftables"
	KindWireGuard     = "wireguard_device"
	KindWireGuardPeer = "wireguard_peer"
	KindSysctl        = "sysctl"
)

// Entry is one line of a plan, and what became of it: the one record that
// logs, status, metrics, `nodeagent plan` and `apply --once` read.
type Entry struct {
	Subsystem string
	Kind      string
	Action    Action
	// Object names what the entry is about, as errors name it: "link
	// shim0", "rule 1000: from 10.10.50.0/24 lookup 150", "nft table inet
	// nodeagent".
	Object string
	// Text is the plan line, its action first.
	Text string
	// Adopt says the entry takes over an object nodeagent did not make
	// (adopt: true in the config) without changing what it does: the
	// only change the first plan of a config from `nodeagent import`
	// should have.
	Adopt bool
	// Err is why the op cannot be applied ('!'), or how applying it
	// failed; nil in a dry run and for what was applied. Its text names the
	// object.
	Err error
}

// Pending reports whether the entry waits for another object (a device,
// a parent link) that a later sync may find.
func (e Entry) Pending() bool {
	var pe *host.PendingError
	return errors.As(e.Err, &pe)
}

// Skipped reports whether the entry was left out of an object that was
// converged without it (a peer file that does not parse).
func (e Entry) Skipped() bool {
	var se *host.SkippedError
	return errors.As(e.Err, &se)
}

// Failed reports whether the entry failed: an error that is neither
// pending, skipped nor held.
func (e Entry) Failed() bool { return e.Err != nil && !e.Pending() && !e.Skipped() && !e.Held() }

// Writes reports whether the entry is a change (as opposed to a report).
func (e Entry) Writes() bool { return e.Action != NotApplied }

// Report is the entries of a sync or a dry run, in the order they are
// applied.
type Report []Entry

// String is the plan text, one line per entry.
func (r Report) String() string {
	var b strings.Builder
	for _, e := range r {
		b.WriteString(e.Text)
		b.WriteByte('\n')
	}
	return b.String()
}

// Lines returns the plan text's lines.
func (r Report) Lines() []string {
	out := make([]string, len(r))
	for i, e := range r {
		out[i] = e.Text
	}
	return out
}

// OnlyAdoptions reports whether every entry of r that writes is an
// adoption (and one does); entries that do not write may be there.
func (r Report) OnlyAdoptions() bool {
	n := 0
	for _, e := range r {
		if !e.Writes() {
			continue
		}
		if !e.Adopt {
			return false
		}
		n++
	}
	return n > 0
}

// Errors returns the entries' errors, in order.
func (r Report) Errors() []error {
	var out []error
	for _, e := range r {
		if e.Err != nil {
			out = append(out, e.Err)
		}
	}
	return out
}

// Err joins the entries' errors, nil when there are none.
func (r Report) Err() error { return errors.Join(r.Errors()...) }

// Writes reports whether any entry is a change.
func (r Report) Writes() bool {
	for _, e := range r {
		if e.Writes() {
			return true
		}
	}
	return false
}

// Fail sets err on every entry of r that has none (an op applied as part
// of a transaction that failed as a whole).
func (r Report) Fail(err error) {
	for i := range r {
		if r[i].Err == nil {
			r[i].Err = err
		}
	}
}

// Entrier is an op that is one line of a report.
type Entrier interface{ Entry() Entry }

// ReportOf is the report of ops, one entry per op, in order.
func ReportOf[O Entrier](ops []O) Report {
	r := make(Report, len(ops))
	for i, o := range ops {
		r[i] = o.Entry()
	}
	return r
}

// Applied finishes a subsystem's Apply: r is what its Execute reported;
// when it wrote, the state reached is read with observe (from the
// snapshot after the sync's writes), else it is before, what the plan was
// made from. A failure to read it is one more entry of the report.
func Applied[O any](sub string, r Report, before O, observe func() (O, error)) (O, Report) {
	if !r.Writes() {
		return before, r
	}
	o, err := observe()
	if err != nil {
		return before, append(r, Failure(sub, fmt.Errorf("%s: observe after apply: %w", sub, err)))
	}
	return o, r
}

// Failure is an entry for what went wrong with a whole subsystem (it
// could not be read), not with one of its ops; err names the subsystem.
func Failure(sub string, err error) Entry {
	return Entry{Subsystem: sub, Kind: sub, Action: NotApplied, Object: sub, Text: "! " + err.Error(), Err: err}
}

// Held reports whether the entry was held back (a fight: agent/fight):
// not applied this sync, on purpose, and not a failure.
func (e Entry) Held() bool {
	var he *host.HeldError
	return errors.As(e.Err, &he)
}

// Hold splits ops into those kept and those held (held says which, from
// their entry); the held come back as entries that did not apply, their
// error a host.HeldError with why.
func Hold[O Entrier](ops []O, held func(Entry) bool, why string) (kept []O, out Report) {
	for _, o := range ops {
		e := o.Entry()
		if e.Writes() && held(e) {
			e.Action = NotApplied
			e.Text = "! " + strings.TrimLeft(e.Text, "+~-! ") + ": held: " + why
			e.Err = fmt.Errorf("%s: %w", e.Object, &host.HeldError{Reason: why})
			out = append(out, e)
			continue
		}
		kept = append(kept, o)
	}
	return kept, out
}
