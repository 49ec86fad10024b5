// Command line (clients/README.md): AMQP_URL [--lane SECONDS] SPEC...,
// SPEC = ID@CANCEL_AT | ID+TIMEOUT_MS | ID. Never prints the URL.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		usage()
	}
	key := Schedule
	var specs []string
	for i := 2; i < len(os.Args); i++ {
		if os.Args[i] == "--lane" && i+1 < len(os.Args) {
			secs, err := strconv.Atoi(os.Args[i+1])
			if err != nil {
				usage()
			}
			key = LaneRoutingKey(time.Duration(secs) * time.Second)
			i++
		} else {
			specs = append(specs, os.Args[i])
		}
	}
	if len(specs) == 0 {
		usage()
	}
	timeouts := NewPublisher(os.Args[1], key)
	defer timeouts.Close()
	ctx := context.Background()
	failed := 0
	for _, spec := range specs {
		var id string
		var err error
		if i := strings.Index(spec, "@"); i >= 0 {
			id = spec[:i]
			var at time.Time
			if at, err = time.Parse(time.RFC3339Nano, spec[i+1:]); err == nil {
				err = timeouts.PublishTimeout(ctx, id, at)
			}
		} else if i := strings.LastIndex(spec, "+"); i >= 0 {
			id = spec[:i]
			var ms int64
			if ms, err = strconv.ParseInt(spec[i+1:], 10, 64); err == nil {
				err = timeouts.PublishTimeoutAfter(ctx, id, time.Now(), time.Duration(ms)*time.Millisecond)
			}
		} else {
			id = spec
			err = timeouts.PublishOrderID(ctx, id)
		}
		if err != nil {
			// The order stands; the sweeper cancels it if it stays unpaid.
			fmt.Fprintf(os.Stderr, "FAILED %s: %v\n", id, err)
			failed++
		} else {
			fmt.Printf("published %s\n", id)
		}
	}
	timeouts.Close()
	if failed > 0 {
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: publisher AMQP_URL [--lane SECONDS] ID@CANCEL_AT|ID+TIMEOUT_MS|ID...")
	os.Exit(2)
}
