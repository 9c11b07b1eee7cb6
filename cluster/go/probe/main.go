// Command probe is the local cluster's own small image: the pod sandbox's pause process, and the
// network, memory and exec probes of the real-node tests. Standard library only, built static.
//
//	probe pause                 wait for SIGTERM, reaping children (the sandbox's PID 1)
//	probe serve ADDR            answer each TCP connection with "probe <hostname>\n"
//	probe dial ADDR [SECONDS]   connect and print the answer; exit 1 when refused or silent
//	probe hog MIB               touch MIB MiB of memory, then wait (the OOM test)
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe pause | serve ADDR | dial ADDR [SECONDS] | hog MIB")
	}
	switch os.Args[1] {
	case "pause":
		pause()
	case "serve":
		serve(arg(2))
	case "dial":
		seconds := 5.0
		if len(os.Args) > 3 {
			seconds = number(os.Args[3])
		}
		dial(arg(2), time.Duration(seconds*float64(time.Second)))
	case "hog":
		hog(int(number(arg(2))))
	default:
		fail("probe: unknown command " + os.Args[1])
	}
}

func arg(i int) string {
	if len(os.Args) <= i {
		fail("probe " + os.Args[1] + ": missing argument")
	}
	return os.Args[i]
}

func number(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 {
		fail("probe: not a number: " + s)
	}
	return v
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(2)
}

func pause() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children: // as PID 1 of the pod, reap what exec'd processes leave
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}

func serve(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe serve:", err)
		os.Exit(1)
	}
	host, _ := os.Hostname()
	fmt.Println("probe serving on", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			continue
		}
		fmt.Fprintf(c, "probe %s\n", host)
		c.Close()
	}
}

func dial(addr string, timeout time.Duration) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		fmt.Println("probe dial:", err)
		os.Exit(1)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Println("probe dial: no answer:", err)
		os.Exit(1)
	}
	fmt.Print(line)
}

func hog(mib int) {
	var held [][]byte
	for i := 0; i < mib; i++ {
		b := make([]byte, 1<<20)
		for j := range b {
			b[j] = 1
		}
		held = append(held, b)
	}
	fmt.Println("probe holds", len(held), "MiB")
	select {}
}
