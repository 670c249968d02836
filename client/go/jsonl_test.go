package moebatch

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	pb "moebatch/client/go/moebatchv1"
)

const chatLine = `{"id": "batch_req_1_0", "custom_id": "q-1", "response": {"status_code": 200, ` +
	`"request_id": "req_1_0", "body": {"id": "chatcmpl-1_0", "object": "chat.completion", ` +
	`"created": 1717000000, "model": "mixtral", "choices": [{"index": 0, "message": {"role": ` +
	`"assistant", "content": "Hello!"}, "finish_reason": "stop", "logprobs": null, ` +
	`"token_ids": [22557, 28808, 2]}], "usage": {"prompt_tokens": 12, "completion_tokens": 3, ` +
	`"total_tokens": 15}}}, "error": null}`

const completionLine = `{"id": "batch_req_1_1", "custom_id": "c-1", "response": {"status_code": 200, ` +
	`"request_id": "req_1_1", "body": {"object": "text_completion", "choices": [{"index": 0, ` +
	`"text": " world", "finish_reason": "length", "token_ids": [1, 2]}]}}, "error": null}`

const responsesLine = `{"id": "batch_req_1_4", "custom_id": "r-1", "response": {"status_code": 200, ` +
	`"request_id": "req_1_4", "body": {"id": "resp_1_4", "object": "response", "status": ` +
	`"incomplete", "output": [{"id": "rs_1_4", "type": "reasoning", "summary": [], "content": ` +
	`[{"type": "reasoning_text", "text": "think"}]}, {"id": "msg_1_4", "type": "message", ` +
	`"status": "incomplete", "role": "assistant", "content": [{"type": "output_text", "text": ` +
	`"Bonjour", "annotations": []}]}], "usage": {"input_tokens": 9, "output_tokens": 4, ` +
	`"total_tokens": 13}, "token_ids": [5, 6, 7, 8]}}, "error": null}`

const failedLine = `{"id": "batch_req_1_2", "custom_id": "q-2", "response": {"status_code": 400, ` +
	`"request_id": "req_1_2", "body": {"error": {"message": "body.temperature: must be in [0, 100], ` +
	`got 7000", "type": "invalid_request_error", "param": "body.temperature", "code": ` +
	`"invalid_argument"}}}, "error": null}`

const notJSONLine = `{"id": "batch_req_1_3", "custom_id": null, "response": null, "error": ` +
	`{"code": "invalid_json", "message": "invalid JSON: parse error at line 1, column 2"}}`

func TestParseOutputLineSuccess(t *testing.T) {
	line, err := ParseOutputLine([]byte(chatLine))
	if err != nil {
		t.Fatal(err)
	}
	if line.CustomID == nil || *line.CustomID != "q-1" || line.ID != "batch_req_1_0" {
		t.Errorf("ids: %+v", line)
	}
	if line.Err() != nil {
		t.Errorf("Err() = %v", line.Err())
	}
	if line.Content() != "Hello!" || !reflect.DeepEqual(line.TokenIDs(), []int32{22557, 28808, 2}) {
		t.Errorf("content %q token ids %v", line.Content(), line.TokenIDs())
	}
	if u := line.Response.Body.Usage; u == nil || u.PromptTokens != 12 || u.TotalTokens != 15 {
		t.Errorf("usage %+v", u)
	}
	line, err = ParseOutputLine([]byte(completionLine))
	if err != nil {
		t.Fatal(err)
	}
	if line.Content() != " world" || line.Response.Body.Choices[0].FinishReason != "length" {
		t.Errorf("completion: %+v", line.Response.Body.Choices[0])
	}
	line, err = ParseOutputLine([]byte(responsesLine))
	if err != nil {
		t.Fatal(err)
	}
	if line.Err() != nil || line.Content() != "Bonjour" ||
		!reflect.DeepEqual(line.TokenIDs(), []int32{5, 6, 7, 8}) {
		t.Errorf("response: err %v content %q token ids %v", line.Err(), line.Content(),
			line.TokenIDs())
	}
	body := line.Response.Body
	if body.Status != "incomplete" || len(body.Output) != 2 || body.Output[0].Type != "reasoning" ||
		body.Usage.InputTokens != 9 || body.Usage.OutputTokens != 4 {
		t.Errorf("response body: %+v", body)
	}
}

func TestParseOutputLineFailures(t *testing.T) {
	line, err := ParseOutputLine([]byte(failedLine))
	if err != nil {
		t.Fatal(err)
	}
	want := "custom_id q-2: invalid_argument: body.temperature: must be in [0, 100], got 7000"
	if line.Err() == nil || line.Err().Error() != want {
		t.Errorf("Err() = %v, want %q", line.Err(), want)
	}
	if p := line.Response.Body.Error.Param; p == nil || *p != "body.temperature" {
		t.Errorf("param %v", p)
	}
	if line.TokenIDs() != nil || line.Content() != "" {
		t.Error("a failed line has no tokens or content")
	}
	line, err = ParseOutputLine([]byte(notJSONLine))
	if err != nil {
		t.Fatal(err)
	}
	if line.CustomID != nil || line.Response != nil {
		t.Errorf("null fields: %+v", line)
	}
	want = "a line without custom_id: invalid_json: invalid JSON: parse error at line 1, column 2"
	if line.Err() == nil || line.Err().Error() != want {
		t.Errorf("Err() = %v, want %q", line.Err(), want)
	}
	for _, bad := range []string{"", "{", `{"id": 1}`, `{} {}`, `[1]`} {
		if _, err := ParseOutputLine([]byte(bad)); err == nil {
			t.Errorf("ParseOutputLine(%q) accepted", bad)
		}
	}
}

func TestParseResult(t *testing.T) {
	line, err := ParseResult(&pb.Result{Index: 0, CustomId: "q-1", Line: chatLine})
	if err != nil || line.Content() != "Hello!" {
		t.Fatalf("ParseResult: %v %v", line, err)
	}
	_, err = ParseResult(&pb.Result{Index: 7, CustomId: "q-8", Line: "nope"})
	if err == nil || !strings.HasPrefix(err.Error(), "result 7 (q-8): invalid output line") {
		t.Errorf("error %v", err)
	}
}

func TestReadOutputLines(t *testing.T) {
	long := strings.Replace(completionLine, `" world"`, `"`+strings.Repeat("y", 200000)+`"`, 1)
	input := chatLine + "\r\n\n   \n" + long + "\n" + failedLine // no final newline
	lines, err := ReadOutputLines(strings.NewReader(input))
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3", len(lines))
	}
	if len(lines[1].Content()) != 200000 || *lines[2].CustomID != "q-2" {
		t.Error("long line or last line without newline lost")
	}
	_, err = ReadOutputLines(strings.NewReader(chatLine + "\n\n{oops\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "line 3: invalid output line") {
		t.Errorf("error %v, want one naming line 3", err)
	}
	lines, err = ReadOutputLines(strings.NewReader(""))
	if err != nil || len(lines) != 0 {
		t.Errorf("empty input: %v %v", lines, err)
	}
}

func TestReadJSONLFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "in.jsonl")
	content := "{\"custom_id\": \"a\"}\n\xff not utf-8 \n"
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	data, err := ReadJSONLFile(path)
	if err != nil || string(data) != content {
		t.Errorf("ReadJSONLFile = %q, %v (bytes must come back verbatim)", data, err)
	}
	missing := filepath.Join(dir, "missing.jsonl")
	if _, err := ReadJSONLFile(missing); err == nil || err.Error() != "cannot read "+missing+": no such file or directory" {
		t.Errorf("missing file: %v", err)
	}
	if _, err := ReadJSONLFile(dir); err == nil || !strings.HasSuffix(err.Error(), "is a directory") {
		t.Errorf("directory: %v", err)
	}
}
