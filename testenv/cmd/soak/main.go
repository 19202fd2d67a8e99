// Command soak is `make soak`: an hour (or --duration) of faults against
// the homelab, with the invariants checked the whole time (see
// testenv/soak). It exits 0 when no invariant was broken, 1 when one
// was (each printed with the seed that replays the run), 2 when the lab
// could not be built.
//
//	soak [--duration 60m] [--seed N] [--nodeagent bin/nodeagent] [--logdir .cache/soak] [--stop-on-violation]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/soak"
)

func main() {
	duration := flag.Duration("duration", 60*time.Minute, "how long the nemesis runs")
	seed := flag.Uint64("seed", 0, "the seed of the fault schedule (0: a random one, printed)")
	nodeagent := flag.String("nodeagent", "bin/nodeagent", "the daemon's binary")
	logdir := flag.String("logdir", ".cache/soak", "where the daemon's log, the schedule and the report go")
	stop := flag.Bool("stop-on-violation", false, "stop at the first violation")
	example := flag.String("example", soak.ExampleFile, "the homelab config the lab runs")
	schedule := flag.Bool("schedule", false, "print the schedule for --seed and --duration, and exit")
	flag.Parse()
	if *schedule {
		fs := soak.Schedule(*seed, *duration, soak.DefaultSchedule)
		fmt.Printf("# seed %d, %s, hash %s\n%s", *seed, *duration, soak.ScheduleHash(fs), soak.ScheduleText(fs))
		return
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "soak needs root: it creates network namespaces (it touches nothing else)")
		os.Exit(2)
	}
	bin, err := filepath.Abs(*nodeagent)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	ex, err := os.ReadFile(*example)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	testenv.NamePrefix = "na-soak-"
	tool := testenv.NewTool("nodeagent-soak")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "\n%v: cleaning up\n", s)
		tool.Close()
		os.Exit(130)
	}()
	var res *soak.Result
	err = tool.Run(func() error {
		res = soak.Run(tool, soak.Options{
			Duration: *duration, Seed: *seed, Nodeagent: bin, Example: ex, LogDir: *logdir, StopOnViolation: *stop,
			Replay: fmt.Sprintf("make soak SOAK=%s SEED=%%d", *duration),
		})
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: the lab failed:", err)
		os.Exit(2)
	}
	if len(res.Violations) > 0 {
		os.Exit(1)
	}
}
