// Command forward calls a gcmoe service from Go: it prints the served model, sends one batch
// of random tokens and prints the output's mean magnitude and the engine time.
//
//	go run ./example/forward -addr 127.0.0.1:50051 -tokens 64
//	go run ./example/forward -addr gcmoe.internal:50051 -tls-ca ca.crt -token "$(cat token)"
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand"
	"time"

	gcmoe "gcmoe/clients/go"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "service address host:port")
	tokens := flag.Int("tokens", 64, "tokens in the batch (T)")
	layer := flag.Uint("layer", 0, "MoE layer index")
	bf16 := flag.Bool("bf16", true, "send BF16 activations (false: FP32)")
	timeout := flag.Duration("timeout", 10*time.Second, "deadline of each call")
	token := flag.String("token", "", "bearer token, if the service asks for one (needs TLS)")
	var tls gcmoe.TLSFiles
	useTLS := flag.Bool("tls", false, "TLS with the system's roots (implied by -tls-ca)")
	flag.StringVar(&tls.CAFile, "tls-ca", "", "TLS: the CA certificate that signed the server's")
	flag.StringVar(&tls.CertFile, "tls-cert", "", "mTLS: the client certificate")
	flag.StringVar(&tls.KeyFile, "tls-key", "", "mTLS: the client key")
	flag.StringVar(&tls.ServerName, "tls-server-name", "", "TLS: the name to check the server against")
	flag.Parse()

	ctx := context.Background()
	options := gcmoe.Options{Token: *token}
	if *useTLS || tls != (gcmoe.TLSFiles{}) {
		creds, err := gcmoe.TLSCredentials(tls)
		if err != nil {
			log.Fatal(err)
		}
		options.Credentials = creds
	}
	client, err := gcmoe.Dial(ctx, *addr, options)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	callCtx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	info, err := client.Info(callCtx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("gcmoe %s: H=%d E=%d top-%d, %d layers, %d ranks (%s)\n", info.GetVersion(),
		info.GetHidden(), info.GetExperts(), info.GetTopK(), info.GetLayers(), info.GetRanks(),
		info.GetBackend())

	T, H, E, k := *tokens, int(info.GetHidden()), int(info.GetExperts()), int(info.GetTopK())
	hidden := make([]float32, T*H)
	for i := range hidden {
		hidden[i] = float32(rand.NormFloat64())
	}
	routing := gcmoe.Routing{TopK: k, IDs: make([]int32, T*k), Weights: make([]float32, T*k)}
	for t := 0; t < T; t++ {
		for j, e := range rand.Perm(E)[:k] {
			routing.IDs[t*k+j] = int32(e)
			routing.Weights[t*k+j] = 1 / float32(k)
		}
	}

	var out *gcmoe.Output
	if *bf16 {
		out, err = client.ForwardBF16(callCtx, uint32(*layer), gcmoe.Float32ToBF16(hidden),
			gcmoe.Shape{T, H}, routing, gcmoe.ForwardOptions{})
	} else {
		out, err = client.ForwardFloat32(callCtx, uint32(*layer), hidden, gcmoe.Shape{T, H},
			routing, gcmoe.ForwardOptions{})
	}
	if err != nil {
		log.Fatal(err)
	}
	sum := 0.0
	for _, v := range out.Float32() {
		sum += math.Abs(float64(v))
	}
	fmt.Printf("output %v %s: mean |y| %.4f, engine %.1f us\n", out.Shape, out.DType,
		sum/float64(T*H), float64(out.Stats.GetEngineNs())/1e3)
}
