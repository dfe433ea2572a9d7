// A container's workload: prints what the pod gave it and exits with the code it was asked for.
package main

import (
	"fmt"
	"os"
	"strconv"
)

func main() {
	for _, k := range []string{"HOSTNAME", "JOB_COMPLETION_INDEX", "POD_NAME", "MESSAGE"} {
		fmt.Printf("%s=%s\n", k, os.Getenv(k))
	}
	code, _ := strconv.Atoi(os.Getenv("EXIT_CODE"))
	os.Exit(code)
}
