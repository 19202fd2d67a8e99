// Command vmtest runs Go package tests inside a qemu VM booting Debian's
// kernel, for tests that need kernel features the host may lack (8021q,
// WireGuard, dummy). See package testenv/vm.
//
// Usage:
//
//	go run ./testenv/cmd/vmtest [flags] PKG... [-args ARG...]
//
// The output matches go test -v, with one "ok" or "FAIL" line per package.
// The exit status is 0 only if every test binary exited 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nodeagent/nodeagent/testenv/vm"
)

func main() {
	var cfg vm.Config
	var modules, files string
	flag.StringVar(&cfg.Run, "run", "", "run only tests matching `regexp` (-test.run)")
	flag.StringVar(&cfg.Bench, "bench", "", "run benchmarks matching `regexp` (-test.bench); without -run, no tests run")
	flag.StringVar(&cfg.BenchTime, "benchtime", "", "benchmark time, e.g. 1s or 100x (-test.benchtime)")
	flag.StringVar(&cfg.Count, "count", "", "run each test and benchmark `n` times (-test.count)")
	flag.StringVar(&cfg.Timeout, "timeout", "10m", "per-binary test timeout (-test.timeout)")
	flag.BoolVar(&cfg.Short, "short", false, "pass -test.short")
	flag.BoolVar(&cfg.Benchmem, "benchmem", false, "pass -test.benchmem")
	flag.StringVar(&cfg.Tags, "tags", "", "build tags for go test -c")
	flag.StringVar(&files, "files", "", "comma-separated files or `dirs`, relative to the module root, to copy into the VM for tests that read beyond testdata (e.g. examples)")
	flag.StringVar(&cfg.CacheDir, "cache", vm.DefaultCacheDir(), "kernel cache `dir` (default $NODEAGENT_VM_CACHE or /var/cache/nodeagent-vm)")
	flag.StringVar(&cfg.KernelPackage, "kernel", "", "kernel `package` (default: what linux-image-amd64 depends on)")
	flag.StringVar(&modules, "modules", "", "comma-separated extra kernel `modules` to load")
	flag.IntVar(&cfg.MemoryMiB, "mem", 2048, "VM memory in MiB")
	flag.IntVar(&cfg.CPUs, "smp", 2, "VM CPUs")
	flag.StringVar(&cfg.Append, "append", "", "extra kernel command line")
	flag.DurationVar(&cfg.VMTimeout, "vm-timeout", 0, "kill qemu after this long (default 30m)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the staging directory (initramfs tree, initrd.gz)")
	flag.BoolVar(&cfg.Verbose, "v", false, "show progress and the boot console")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: vmtest [flags] PKG... [-args ARG...]\n\nflags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()

	for i, a := range flag.Args() {
		if a == "-args" || a == "--args" {
			cfg.Args = flag.Args()[i+1:]
			break
		}
		cfg.Packages = append(cfg.Packages, a)
	}
	if len(cfg.Packages) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if files != "" {
		cfg.Files = strings.Split(files, ",")
	}
	if modules != "" {
		cfg.ExtraModules = strings.Split(modules, ",")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := vm.Run(ctx, cfg)
	if res != nil && res.InitrdBytes > 0 {
		fmt.Fprintf(os.Stderr, "vmtest: kernel %s, initrd %.1f MiB, boot %.1fs, total %.1fs\n",
			res.KernelVersion, float64(res.InitrdBytes)/(1<<20), res.Boot.Seconds(), res.Total.Seconds())
		if res.StageDir != "" {
			fmt.Fprintf(os.Stderr, "vmtest: staging directory kept: %s\n", res.StageDir)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmtest: %v\n", err)
		os.Exit(1)
	}
	if !res.Passed() {
		os.Exit(1)
	}
}
