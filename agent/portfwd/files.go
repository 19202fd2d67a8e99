package portfwd

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
)

// The port files: DIR/DEVICE.port holds the port a device forwards, as a
// decimal number and a newline, while it has one; a reader (a sidecar, a
// script) takes the file's presence as "there is a port". They are a
// subsystem of their own, in the shape of the others: Observe the
// directory, MakePlan the writes and removals, Apply exactly those.

// FileExt ends a port file's name: DEVICE.port.
const FileExt = ".port"

// maxPortFile bounds what is read of a port file: "65535\n" and some.
const maxPortFile = 64

// Files is the port files' state: the port each device's file holds (0:
// a file that holds no port, which a reader cannot use either).
type Files map[string]int

// ObserveFiles reads the port files in dir; a missing dir holds none.
func ObserveFiles(dir string) (Files, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return Files{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := Files{}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), FileExt)
		if !ok || name == "" || !e.Type().IsRegular() {
			continue
		}
		b, err := fsafe.ReadFile(filepath.Join(dir, e.Name()), fsafe.Rules{MaxSize: maxPortFile})
		port, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || perr != nil || port < 1 || port > 65535 {
			port = 0
		}
		out[name] = port
	}
	return out, nil
}

// FileOp is one change to the port files.
type FileOp struct {
	Device string
	// Port is what the file is to hold; 0 removes it.
	Port int
}

func (op FileOp) String() string {
	if op.Port == 0 {
		return "- port file " + op.Device + FileExt
	}
	return fmt.Sprintf("+ port file %s%s: %d", op.Device, FileExt, op.Port)
}

// MakeFilesPlan is what turns observed into want (ports by device; a
// device absent or 0 has no file), in device order.
func MakeFilesPlan(want, observed Files) []FileOp {
	var ops []FileOp
	for _, dev := range slices.Sorted(maps.Keys(want)) {
		if p := want[dev]; p != 0 {
			if have, ok := observed[dev]; !ok || have != p {
				ops = append(ops, FileOp{dev, p})
			}
		}
	}
	for _, dev := range slices.Sorted(maps.Keys(observed)) {
		if want[dev] == 0 {
			ops = append(ops, FileOp{dev, 0})
		}
	}
	return ops
}

// ApplyFiles executes ops in dir: a file is replaced whole by a rename
// (a reader never sees half of one, and a directory watch sees one
// IN_MOVED_TO per port); a file already gone is no error. It returns the
// files' state reached and the ops that failed.
func ApplyFiles(dir string, observed Files, ops []FileOp) (Files, error) {
	out := maps.Clone(observed)
	if out == nil {
		out = Files{}
	}
	var errs []error
	for _, op := range ops {
		path := filepath.Join(dir, op.Device+FileExt)
		var err error
		if op.Port == 0 {
			if err = os.Remove(path); errors.Is(err, fs.ErrNotExist) {
				err = nil
			}
		} else if err = os.MkdirAll(dir, 0o755); err == nil {
			err = fsafe.WriteFile(path, []byte(strconv.Itoa(op.Port)+"\n"), 0o644)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("port file %s: %w", path, err))
			continue
		}
		if op.Port == 0 {
			delete(out, op.Device)
		} else {
			out[op.Device] = op.Port
		}
	}
	return out, errors.Join(errs...)
}

// RemoveFiles removes every port file in dir (teardown: no device
// forwards a port any more); a missing dir is no error.
func RemoveFiles(dir string) error {
	have, err := ObserveFiles(dir)
	if err != nil {
		return err
	}
	_, err = ApplyFiles(dir, have, MakeFilesPlan(nil, have))
	return err
}
