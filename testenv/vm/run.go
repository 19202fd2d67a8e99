package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// kernelArgs is the fixed part of the kernel command line: serial console,
// reboot (and so exit qemu, given -no-reboot) on panic, and no kernel noise
// between test output lines.
const kernelArgs = "console=ttyS0 panic=-1 quiet loglevel=1"

// bootLogLines is how much of the boot console is kept to explain a VM that
// never reaches the tests.
const bootLogLines = 200

// qemuArgs returns the qemu command line. KVM is not used: on the CI
// machines the kernel hangs early under it.
func qemuArgs(cfg *Config, k *kernel, initrd string) []string {
	cmdline := kernelArgs
	if cfg.Append != "" {
		cmdline += " " + cfg.Append
	}
	return []string{
		"-accel", "tcg", "-cpu", "max",
		"-m", strconv.Itoa(cfg.MemoryMiB), "-smp", strconv.Itoa(cfg.CPUs),
		"-kernel", k.image, "-initrd", initrd, "-append", cmdline,
		"-nographic", "-no-reboot", "-nic", "none",
	}
}

// boot runs qemu and turns its serial console into go test output, filling
// in res.
func boot(ctx context.Context, cfg *Config, k *kernel, initrd string, pkgs []testPackage, res *Result) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.VMTimeout)
	defer cancel()

	args := qemuArgs(cfg, k, initrd)
	cfg.debugf("vmtest: qemu-system-x86_64 %s", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	// qemu's stdin stays /dev/null: no monitor escapes, no tty changes.
	cmd.Stderr = cfg.Log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start qemu (install qemu-system-x86): %w", err)
	}

	c := newConsole(cfg, pkgs, res, start)
	c.read(stdout)
	werr := cmd.Wait()

	var unfinished []string
	for i, p := range pkgs {
		if !c.results[i].Finished {
			unfinished = append(unfinished, p.importPath)
			fmt.Fprintf(cfg.Out, "FAIL\t%s\t[vm stopped before the test binary finished]\n", p.importPath)
		}
	}
	if len(unfinished) == 0 {
		return nil
	}
	if !c.ready {
		c.dumpBootLog()
	}
	why := "the vm stopped"
	if c.current >= 0 {
		why = fmt.Sprintf("the vm stopped while %s was running (a kernel panic, or the test powered the vm off)", pkgs[c.current].importPath)
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		why = fmt.Sprintf("the vm timed out after %v (-vm-timeout) and was killed", cfg.VMTimeout)
	case ctx.Err() != nil:
		why = "the run was interrupted"
	case werr != nil:
		why = fmt.Sprintf("qemu failed: %v", werr)
	case !c.ready:
		why = "the vm stopped before /init finished its setup (a kernel panic or /init error; boot log above)"
	}
	return fmt.Errorf("%s; no exit marker from %s", why, strings.Join(unfinished, ", "))
}

// console follows the serial console.
type console struct {
	cfg     *Config
	pkgs    []testPackage
	res     *Result
	results []*PackageResult
	start   time.Time

	ready   bool
	current int // index of the running package, or -1
	began   time.Time
	bootLog []string
}

func newConsole(cfg *Config, pkgs []testPackage, res *Result, start time.Time) *console {
	c := &console{cfg: cfg, pkgs: pkgs, res: res, start: start, current: -1}
	for _, p := range pkgs {
		for i := range res.Packages {
			if res.Packages[i].ImportPath == p.importPath && !res.Packages[i].NoTests {
				c.results = append(c.results, &res.Packages[i])
				break
			}
		}
	}
	return c
}

// read consumes the console until EOF.
func (c *console) read(r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			c.line(strings.TrimSuffix(strings.ReplaceAll(line, "\r", ""), "\n"))
		}
		if err != nil {
			return
		}
	}
}

// line handles one console line. A marker may follow output that lacked a
// final newline; that output is passed on as a line of its own.
func (c *console) line(s string) {
	i := strings.Index(s, markerPrefix)
	if i < 0 {
		c.text(s)
		return
	}
	if i > 0 {
		c.text(s[:i])
	}
	rest := s[i+len(markerPrefix):]
	end := strings.Index(rest, "@@")
	if end < 0 {
		c.text(s[i:])
		return
	}
	c.marker(rest[:end])
	if tail := rest[end+2:]; tail != "" {
		c.line(tail)
	}
}

// text passes a non-marker line on: test output to Out unchanged, /init's
// notes to Log, everything else to Log in verbose mode (and before /init is
// ready, into the boot log).
func (c *console) text(s string) {
	switch {
	case c.current >= 0:
		fmt.Fprintln(c.cfg.Out, s)
	case strings.HasPrefix(s, initLogTag):
		fmt.Fprintln(c.cfg.Log, s)
	case c.cfg.Verbose:
		fmt.Fprintln(c.cfg.Log, s)
	case c.done() && strings.HasSuffix(s, "reboot: Power down"):
		// The kernel's last words after poweroff -f.
	case !c.ready:
		c.bootLog = append(c.bootLog, s)
		if len(c.bootLog) > bootLogLines {
			c.bootLog = c.bootLog[1:]
		}
	default:
		fmt.Fprintln(c.cfg.Log, s)
	}
}

func (c *console) marker(m string) {
	f := strings.Fields(m)
	switch {
	case len(f) == 1 && f[0] == "ready":
		c.ready = true
		c.res.Boot = time.Since(c.start)
		c.cfg.debugf("vmtest: vm ready after %.1fs", c.res.Boot.Seconds())
	case len(f) == 2 && f[0] == "start":
		i, err := strconv.Atoi(f[1])
		if err != nil || i < 0 || i >= len(c.pkgs) {
			return
		}
		c.current, c.began = i, time.Now()
	case len(f) == 3 && f[0] == "exit":
		i, err1 := strconv.Atoi(f[1])
		code, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil || i < 0 || i >= len(c.pkgs) {
			return
		}
		r := c.results[i]
		r.Finished, r.ExitCode, r.Elapsed = true, code, time.Since(c.began)
		c.current = -1
		if code == 0 {
			fmt.Fprintf(c.cfg.Out, "ok  \t%s\t%.3fs\n", r.ImportPath, r.Elapsed.Seconds())
		} else {
			fmt.Fprintf(c.cfg.Out, "FAIL\t%s\t%.3fs\n", r.ImportPath, r.Elapsed.Seconds())
		}
	}
}

// done reports whether every test binary has finished.
func (c *console) done() bool {
	for _, r := range c.results {
		if !r.Finished {
			return false
		}
	}
	return true
}

// dumpBootLog writes the kept boot console to Log.
func (c *console) dumpBootLog() {
	if len(c.bootLog) == 0 {
		c.cfg.logf("vmtest: the vm printed nothing on its console")
		return
	}
	c.cfg.logf("vmtest: last %d console lines before the vm stopped:", len(c.bootLog))
	for _, s := range c.bootLog {
		fmt.Fprintln(c.cfg.Log, "  "+s)
	}
}
