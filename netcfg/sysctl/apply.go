package sysctl

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"golang.org/x/sys/unix"
)

// Apply executes p inside h's namespace and returns the state it reached.
// Each key is read again just before it is written and skipped when it
// already has its value (an earlier write may have propagated to it). A key
// that cannot be set, or is pending, is reported by its key and does not
// stop the others; a written key that does not read back as written is
// reported too. The returned error joins every failure; pending keys wrap
// host.PendingError.
func Apply(ctx context.Context, h *host.Host, p Plan) (Observed, error) {
	if p.Empty() {
		return p.Observed, nil
	}
	root := p.Desired.root()
	var errs []error
	var written []Op
	err := h.Do(func() error {
		for _, o := range p.Ops {
			if o.Kind != OpSet {
				errs = append(errs, o.err())
				continue
			}
			if err := ctx.Err(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", o.Object(), err))
				continue
			}
			wrote, err := set(h, root, o)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", o.Object(), err))
			} else if wrote {
				written = append(written, o)
			}
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	obs, err := Observe(ctx, h, p.Desired)
	if err != nil {
		return obs, errors.Join(append(errs, err)...)
	}
	for _, o := range written {
		if got := obs.Keys[o.Key]; !equalValue(got.Raw, o.New) {
			errs = append(errs, fmt.Errorf("%s: wrote %s but it reads back %s", o.Object(), show(normalize(o.New)), show(normalize(got.Raw))))
		}
	}
	return obs, errors.Join(errs...)
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
