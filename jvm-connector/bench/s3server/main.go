// An S3 server on loopback for the remote-training benchmark (jvm-connector/bench/remote.sh;
// spec/performance.md §13): gofakes3 with its in-memory backend, plus what the benchmark needs
// around it:
//
//   - a per-request delay before the handler runs (time to first byte: the link's latency; the
//     bandwidth is shaped by the kernel, tc tbf on the namespace's loopback, not here);
//
//   - counters of requests and of response body bytes, read and reset on /_bench/ endpoints
//     (bucket names cannot start with "_", so these never reach gofakes3).
//
//     s3server -addr 127.0.0.1:0 -bucket data      prints {"addr": "127.0.0.1:PORT"} on stdout
//     GET  /_bench/stats                            {"requests", "gets", "bytes_out", "bytes_in", "delay_ms"}
//     POST /_bench/reset                            counters to 0
//     POST /_bench/delay?ms=25                      the per-request delay from now on
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

type counters struct {
	requests, gets, bytesOut, bytesIn atomic.Int64
	delayMicros                       atomic.Int64
}

func (c *counters) snapshot() map[string]any {
	return map[string]any{
		"requests": c.requests.Load(), "gets": c.gets.Load(), "bytes_out": c.bytesOut.Load(),
		"bytes_in": c.bytesIn.Load(), "delay_ms": float64(c.delayMicros.Load()) / 1000,
	}
}

// countingWriter counts the body bytes of a response.
type countingWriter struct {
	http.ResponseWriter
	n      *atomic.Int64
	status *int
}

func (w countingWriter) WriteHeader(code int) {
	*w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w countingWriter) Write(p []byte) (int, error) {
	k, err := w.ResponseWriter.Write(p)
	w.n.Add(int64(k))
	return k, err
}

// countingReader counts the body bytes of a request.
type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r countingReader) Read(p []byte) (int, error) {
	k, err := r.ReadCloser.Read(p)
	r.n.Add(int64(k))
	return k, err
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	bucket := flag.String("bucket", "data", "bucket to create at start")
	delayMs := flag.Float64("delay-ms", 0, "delay before each request is handled (ms)")
	logRequests := flag.Bool("log", false, "log each request (method, path, range, status, body bytes) to stderr")
	flag.Parse()

	backend := s3mem.New()
	if err := backend.CreateBucket(*bucket); err != nil {
		log.Fatalf("create bucket %s: %v", *bucket, err)
	}
	s3 := gofakes3.New(backend, gofakes3.WithLogger(gofakes3.DiscardLog())).Server()
	c := &counters{}
	c.delayMicros.Store(int64(*delayMs * 1000))

	mux := http.NewServeMux()
	mux.HandleFunc("GET /_bench/stats", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(c.snapshot())
	})
	mux.HandleFunc("POST /_bench/reset", func(w http.ResponseWriter, r *http.Request) {
		c.requests.Store(0)
		c.gets.Store(0)
		c.bytesOut.Store(0)
		c.bytesIn.Store(0)
		json.NewEncoder(w).Encode(c.snapshot())
	})
	mux.HandleFunc("POST /_bench/delay", func(w http.ResponseWriter, r *http.Request) {
		ms, err := strconv.ParseFloat(r.URL.Query().Get("ms"), 64)
		if err != nil || ms < 0 {
			http.Error(w, "ms must be a number >= 0", http.StatusBadRequest)
			return
		}
		c.delayMicros.Store(int64(ms * 1000))
		json.NewEncoder(w).Encode(c.snapshot())
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if d := c.delayMicros.Load(); d > 0 {
			time.Sleep(time.Duration(d) * time.Microsecond)
		}
		c.requests.Add(1)
		if r.Method == http.MethodGet {
			c.gets.Add(1)
		}
		r.Body = countingReader{r.Body, &c.bytesIn}
		status := http.StatusOK
		var n atomic.Int64
		s3.ServeHTTP(countingWriter{w, &n, &status}, r)
		c.bytesOut.Add(n.Load())
		if *logRequests {
			log.Printf("%s %s range=%q status=%d bytes=%d start=%.3f dur=%.3f", r.Method, r.URL.Path, r.Header.Get("Range"),
				status, n.Load(), float64(start.UnixMicro())/1e6, time.Since(start).Seconds())
		}
	})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("listen %s: %v", *addr, err)
	}
	fmt.Printf("{\"addr\": %q}\n", ln.Addr().String())
	os.Stdout.Sync()

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		b, _ := json.Marshal(c.snapshot())
		fmt.Fprintf(os.Stderr, "s3server stats at exit: %s\n", b)
		os.Exit(0)
	}()
	log.Fatal(http.Serve(ln, mux))
}
