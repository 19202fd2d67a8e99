// Command debroots builds the cached Debian roots the tests run newer
// download clients from (testenv/debroot), when they are missing; make
// test runs it before the tests, so the builds do not count against a
// test binary's timeout.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/nodeagent/nodeagent/testenv/debroot"
)

func main() {
	cache := flag.String("cache", debroot.DefaultCacheDir(), "cache `dir`")
	flag.Parse()
	suites := flag.Args()
	if len(suites) == 0 {
		suites = debroot.Suites
	}
	// The suites at once: a build is mostly downloads and unpacking.
	type result struct {
		suite, dir string
		err        error
	}
	results := make(chan result, len(suites))
	for _, s := range suites {
		go func() {
			dir, err := debroot.Build(context.Background(), debroot.Options{Suite: s, CacheDir: *cache})
			results <- result{s, dir, err}
		}()
	}
	status := 0
	for range suites {
		r := <-results
		if r.err != nil {
			fmt.Fprintf(os.Stderr, "debroots: %v\n", r.err)
			status = 1
			continue
		}
		fmt.Printf("%s %s\n", r.suite, r.dir)
	}
	os.Exit(status)
}
