// Package offline is `nodeagent validate --offline`: the config checked
// away from its node, as in a repository's CI before it is deployed. The
// schema (every field known and of its type, each error at its line),
// the semantics (ranges, addresses, names) and the cross-references (a
// route's table and device, a rule's table, a kill switch's sources, a
// PIA section's routing) are checked as `nodeagent validate` checks them,
// and the lint warnings printed; no file the config names is read (keys,
// credentials, peersDir, the port hook, CA files, the kubeconfig), nor the
// state directory (a PIA region is checked for its form only, not against
// a cached server list), nor the kernel. Only the config itself is read.
package offline

import (
	"errors"
	"fmt"
	"io"

	"github.com/nodeagent/nodeagent/agent/saveguard"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/lint"
)

// InvalidError is a config that failed validation. Its text is the list
// of file:line: field: reason lines and nothing else.
type InvalidError struct{ Err error }

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

// Validate checks the config at path without reading any file it names
// and writes the verdict and the warnings to w: "PATH: valid (offline:
// ...)" and "warning: file:line: field: reason" lines. A config that
// fails is an *InvalidError; a config that cannot be read is the read's
// error.
func Validate(w io.Writer, path string) error {
	c, raw, err := config.ReadWith(path, config.Options{SkipFileChecks: true})
	var list config.ErrorList
	invalid := errors.As(err, &list)
	if (err == nil || invalid) && saveguard.Empty(raw) {
		// What a truncating or failed write leaves is never a config.
		return &InvalidError{saveguard.EmptyError(path)}
	}
	switch {
	case invalid:
		return &InvalidError{err}
	case err != nil:
		return err
	}
	if err := netcfg.CheckOffline(c); err != nil {
		return &InvalidError{fmt.Errorf("%s: %w", path, err)}
	}
	fmt.Fprintf(w, "%s: valid (offline: the files it names were not read; validate without --offline on the node reads them)\n", path)
	for _, warn := range lint.Check(c) {
		fmt.Fprintf(w, "warning: %s\n", warn.Error())
	}
	return nil
}
