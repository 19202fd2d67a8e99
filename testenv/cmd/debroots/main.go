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
	status := 0
	for _, s := range suites {
		dir, err := debroot.Build(context.Background(), debroot.Options{Suite: s, CacheDir: *cache})
		if err != nil {
			fmt.Fprintf(os.Stderr, "debroots: %v\n", err)
			status = 1
			continue
		}
		fmt.Printf("%s %s\n", s, dir)
	}
	os.Exit(status)
}
