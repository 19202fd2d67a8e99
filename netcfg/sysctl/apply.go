package sysctl

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"golang.org/x/sys/unix"
)

// Apply executes p (Execute) and returns the state it reached, with the
// report of every key.
func Apply(ctx context.Context, snap *host.Snapshot, p Plan) (Observed, plan.Report) {
	return plan.Applied(plan.Sysctls, Execute(ctx, snap, p), p.Observed, func() (Observed, error) { return Observe(ctx, snap.After(), p.Desired) })
}

// Execute carries out exactly p's ops inside the namespace and reports
// each key. A key is read again just before it is written and skipped when
// it already has its value (an earlier write may have propagated to it),
// and read back after: one that does not read back as written is
// reported. A key that cannot be set, or is pending, is reported by its key
// and does not stop the others; a key of an interface this sync was to
// create that does not exist is pending.
func Execute(ctx context.Context, snap *host.Snapshot, p Plan) plan.Report {
	r := p.Report()
	if !r.Writes() {
		return r
	}
	h := snap.Host()
	root := p.Desired.root()
	err := h.Do(func() error {
		for i, o := range p.Ops {
			if o.Kind != OpSet {
				continue // reported as planned
			}
			if err := ctx.Err(); err != nil {
				r[i].Err = fmt.Errorf("%s: %w", o.Object(), err)
				continue
			}
			wrote, err := set(h, root, o)
			switch {
			case err != nil && o.NewIface && errors.Is(err, os.ErrNotExist):
				r[i].Err = fmt.Errorf("%s: %w", o.Object(), &host.PendingError{Reason: "the interface does not exist yet"})
			case err != nil:
				r[i].Err = fmt.Errorf("%s: %w", o.Object(), err)
			case wrote:
				if got := readKey(keyPath(root, o.Key)); !equalValue(got.Raw, o.New) {
					r[i].Err = fmt.Errorf("%s: wrote %s but it reads back %s", o.Object(), show(normalize(o.New)), show(normalize(got.Raw)))
				}
			}
		}
		return nil
	})
	if err != nil {
		r.Fail(fmt.Errorf("sysctls: %w", err))
	}
	return r
}

// keyPath is the file of key under root.
func keyPath(root, key string) string {
	names, _ := parseKey(key)
	return pathOf(root, names)
}

// set writes o.New unless the key has it already, and reports whether it
// wrote. It runs inside the namespace.
func set(h *host.Host, root string, o Op) (bool, error) {
	names, err := parseKey(o.Key)
	if err != nil {
		return false, err
	}
	p := pathOf(root, names)
	old := o.Old
	if cur, err := os.ReadFile(p); err == nil {
		if equalValue(string(cur), o.New) {
			return false, nil
		}
		old = normalize(string(cur))
	}
	cannot := func(err error) error {
		return fmt.Errorf("is %s, want %s, and it cannot be written: %w", show(old), show(normalize(o.New)), why(root, err))
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if errors.Is(err, os.ErrNotExist) && o.NewIface {
		return false, err
	}
	if err != nil {
		return false, cannot(err)
	}
	h.Wrote(1)
	_, err = f.WriteString(o.New + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return true, cannot(err)
	}
	return true, nil
}

// why explains a failed open or write of a key under root.
func why(root string, err error) error {
	switch {
	case errors.Is(err, unix.EROFS):
		return fmt.Errorf("%s is read-only (%w)", root, err)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("not permitted (%w)", err)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("it no longer exists (%w)", err)
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("the kernel rejects the value (%w)", err)
	}
	return err
}
