// A chained agent loop on one Connect stream, in Go, built from Debian's
// grpc-go and protobuf-go packages (see ../README.md and ../run.sh).
//
//	agentloop HOST:PORT [TURNS]
//
// Each turn sends only the new input with previous_response_id; the server
// reuses the stream's cached state, so cached_tokens must grow every turn.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	v1 "github.com/bidi-responses/bidi-responses/gen/go/bidi_responses/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// codec marshals with protobuf-go's v2 API. Debian's grpc-go 1.33 default
// codec goes through the v1 API shim and panics on these messages.
type codec struct{}

func (codec) Marshal(v interface{}) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (codec) Unmarshal(data []byte, v interface{}) error {
	return proto.Unmarshal(data, v.(proto.Message))
}
func (codec) Name() string { return "proto" }

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: agentloop HOST:PORT [TURNS]")
	}
	turns := 4
	if len(os.Args) > 2 {
		turns, _ = strconv.Atoi(os.Args[2])
	}
	encoding.RegisterCodec(codec{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, os.Args[1],
		grpc.WithInsecure(), grpc.WithBlock()) // grpc-go 1.33 predates credentials/insecure
	if err != nil {
		fail("dial: %v", err)
	}
	defer conn.Close()
	if key := os.Getenv("API_KEY"); key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
	}
	stream, err := v1.NewResponsesServiceClient(conn).Connect(ctx)
	if err != nil {
		fail("connect: %v", err)
	}
	// google.protobuf.Struct: structpb builds it from plain Go values.
	params, err := structpb.NewStruct(map[string]interface{}{
		"type":       "object",
		"properties": map[string]interface{}{"cmd": map[string]interface{}{"type": "string"}},
		"required":   []interface{}{"cmd"},
	})
	if err != nil {
		fail("struct: %v", err)
	}
	tools := []*v1.Tool{{Tool: &v1.Tool_Function{Function: &v1.FunctionTool{
		Name: "exec_command", Parameters: params}}}}
	userText := func(text string) *v1.Item {
		return &v1.Item{Item: &v1.Item_Message{Message: &v1.MessageItem{
			Role: "user",
			Content: []*v1.ContentPart{{Part: &v1.ContentPart_InputText{
				InputText: &v1.InputText{Text: text}}}},
		}}}
	}
	input := []*v1.Item{userText("Fix the failing test.")}
	var previous *string
	var lastCached int64 = -1
	for turn := 0; turn < turns; turn++ {
		create := &v1.ResponseCreateParams{Model: "sim-model", Input: input, Tools: tools,
			PreviousResponseId: previous}
		if err := stream.Send(&v1.ConnectRequest{Event: &v1.ConnectRequest_ResponseCreate{
			ResponseCreate: create}}); err != nil {
			fail("send: %v", err)
		}
		var calls []*v1.FunctionCallItem
		var response *v1.Response
		for response == nil {
			msg, err := stream.Recv()
			if err == io.EOF {
				fail("stream ended early")
			} else if err != nil {
				fail("recv: %v", err)
			}
			switch e := msg.Event.(type) {
			case *v1.ConnectResponse_ResponseOutputItemDone:
				if fc := e.ResponseOutputItemDone.Item.GetFunctionCall(); fc != nil {
					calls = append(calls, fc)
				}
			case *v1.ConnectResponse_ResponseCompleted:
				response = e.ResponseCompleted.Response
			case *v1.ConnectResponse_Error:
				fail("error event: %v", e.Error.Error)
			}
		}
		// int64 in Go is exact; other languages need care (JS: BigInt or strings).
		cached := response.Usage.InputTokensDetails.CachedTokens
		fmt.Printf("{\"turn\":%d,\"id\":%q,\"input_tokens\":%d,\"cached_tokens\":%d}\n",
			turn, response.Id, response.Usage.InputTokens, cached)
		if turn > 0 && cached <= lastCached {
			fail("cached_tokens did not grow: %d -> %d", lastCached, cached)
		}
		lastCached = cached
		id := response.Id
		previous = &id
		input = nil
		for _, call := range calls {
			input = append(input, &v1.Item{Item: &v1.Item_FunctionCallOutput{
				FunctionCallOutput: &v1.FunctionCallOutputItem{CallId: call.CallId, Output: "ok: 1 passed"}}})
		}
		if len(input) == 0 {
			input = []*v1.Item{userText("Next step.")}
		}
	}
	if err := stream.CloseSend(); err != nil {
		fail("close: %v", err)
	}
	fmt.Printf("{\"ok\":true,\"turns\":%d}\n", turns)
}
