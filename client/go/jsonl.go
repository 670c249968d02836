package moebatch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	pb "moebatch/client/go/moebatchv1"
)

// ReadJSONLFile reads an OpenAI batch input file whole ("-" reads standard input), to be sent
// with CreateJobJSONL. The content is not checked here: the daemon validates every line and
// names the bad one.
func ReadJSONLFile(path string) ([]byte, error) {
	if path == "-" {
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			return nil, fmt.Errorf("cannot read standard input: %w", err)
		}
		return data, nil
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, unwrapPathError(err))
	}
	if info.IsDir() {
		return nil, fmt.Errorf("cannot read %s: is a directory", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, unwrapPathError(err))
	}
	return data, nil
}

// unwrapPathError drops the operation and path of an *fs.PathError, which the caller already
// names ("cannot read x.jsonl: no such file or directory").
func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// OutputLine is an OpenAI batch output line (docs/api.md, "Output line"), as GetResults' Result.Line
// and `moebatch-go results` carry it.
type OutputLine struct {
	ID string `json:"id"`
	// CustomID is nil when the input line had no string custom_id.
	CustomID *string `json:"custom_id"`
	// Response is nil for a line that was not a JSON object (see Error).
	Response *OutputResponse `json:"response"`
	// Error is set for a line that was not a JSON object.
	Error *LineError `json:"error"`
}

// OutputResponse is an output line's response: status 200 with a completion, or 400 / 500 with
// an error body.
type OutputResponse struct {
	StatusCode int        `json:"status_code"`
	RequestID  string     `json:"request_id"`
	Body       OutputBody `json:"body"`
}

// OutputBody is a chat.completion or text_completion object, a response object (a /v1/responses
// request: Output and TokenIDs instead of Choices), or an error.
type OutputBody struct {
	ID      string     `json:"id"`
	Object  string     `json:"object"`
	Created int64      `json:"created"`
	Model   string     `json:"model"`
	Choices []Choice   `json:"choices"`
	Usage   *Usage     `json:"usage"`
	Error   *LineError `json:"error"`
	// Status of a response object: "completed", or "incomplete" when max_output_tokens ended it.
	Status string `json:"status"`
	// Output is a response object's items: the assistant "message" item, after a "reasoning"
	// item for a harmony model (gpt-oss).
	Output []OutputItem `json:"output"`
	// TokenIDs are a response object's generated token ids (moebatch's extension).
	TokenIDs []int32 `json:"token_ids"`
}

// OutputItem is an item of a response object's output: Type "message" (Content of
// "output_text" parts) or "reasoning" (Content of "reasoning_text" parts).
type OutputItem struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Content []OutputPart `json:"content"`
}

// OutputPart is a text part of an OutputItem.
type OutputPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// Choice is one generated completion.
type Choice struct {
	Index int `json:"index"`
	// Message is the answer of a chat request; Text that of a completion request.
	Message      *OutputMessage `json:"message"`
	Text         string         `json:"text"`
	FinishReason string         `json:"finish_reason"`
	// TokenIDs are the generated token ids (moebatch's extension), EOS and stop-string tokens
	// included.
	TokenIDs []int32 `json:"token_ids"`
}

// OutputMessage is the assistant message of a chat completion.
type OutputMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Usage counts a request's tokens (a response object's as InputTokens and OutputTokens).
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// LineError is the error of a failed request.
type LineError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	// Param is the JSON path of the offending field; nil when the message names none.
	Param *string `json:"param"`
	Code  string  `json:"code"`
}

// Err is nil for a successful request, else an error with the line's message: "custom_id
// q-2: invalid_argument: body.temperature: must be in [0, 100], got 7000".
func (l *OutputLine) Err() error {
	var e *LineError
	switch {
	case l.Error != nil:
		e = l.Error
	case l.Response == nil:
		e = &LineError{Message: "no response"}
	case l.Response.Body.Error != nil:
		e = l.Response.Body.Error
	case l.Response.StatusCode != 200:
		e = &LineError{Message: fmt.Sprintf("status %d", l.Response.StatusCode)}
	default:
		return nil
	}
	who := "a line without custom_id"
	if l.CustomID != nil {
		who = "custom_id " + *l.CustomID
	}
	if e.Code != "" {
		return fmt.Errorf("%s: %s: %s", who, e.Code, e.Message)
	}
	return fmt.Errorf("%s: %s", who, e.Message)
}

// Content is the first choice's text (a chat answer's content or a completion's text), or a
// response object's output text (its message item's "output_text" parts); empty for a failed
// request.
func (l *OutputLine) Content() string {
	if l.Response == nil {
		return ""
	}
	if body := l.Response.Body; len(body.Choices) == 0 {
		var text strings.Builder
		for _, item := range body.Output {
			if item.Type != "message" {
				continue
			}
			for _, part := range item.Content {
				if part.Type == "output_text" {
					text.WriteString(part.Text)
				}
			}
		}
		return text.String()
	}
	c := l.Response.Body.Choices[0]
	if c.Message != nil {
		return c.Message.Content
	}
	return c.Text
}

// TokenIDs are the first choice's generated token ids (a response object's), nil for a failed
// request.
func (l *OutputLine) TokenIDs() []int32 {
	if l.Response == nil {
		return nil
	}
	if len(l.Response.Body.Choices) == 0 {
		return l.Response.Body.TokenIDs
	}
	return l.Response.Body.Choices[0].TokenIDs
}

// ParseOutputLine decodes one output line.
func ParseOutputLine(line []byte) (*OutputLine, error) {
	var out OutputLine
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("invalid output line: %w", err)
	}
	if dec.More() {
		return nil, errors.New("invalid output line: more than one JSON value")
	}
	return &out, nil
}

// ParseResult decodes a Result's line.
func ParseResult(r *pb.Result) (*OutputLine, error) {
	out, err := ParseOutputLine([]byte(r.GetLine()))
	if err != nil {
		return nil, fmt.Errorf("result %d (%s): %w", r.GetIndex(), r.GetCustomId(), err)
	}
	return out, nil
}

// ReadOutputLines reads an output file (JSONL, e.g. written by `moebatch-go results -o`); blank
// lines are skipped, lines may end in "\r\n", and an error names its 1-based line.
func ReadOutputLines(r io.Reader) ([]*OutputLine, error) {
	var lines []*OutputLine
	br := bufio.NewReader(r) // no line length limit, unlike bufio.Scanner
	for number := 1; ; number++ {
		text, err := br.ReadString('\n')
		if err != nil && err != io.EOF {
			return lines, fmt.Errorf("line %d: %w", number, err)
		}
		if trimmed := strings.TrimRight(text, "\r\n"); strings.TrimSpace(trimmed) != "" {
			line, parseErr := ParseOutputLine([]byte(trimmed))
			if parseErr != nil {
				return lines, fmt.Errorf("line %d: %w", number, parseErr)
			}
			lines = append(lines, line)
		}
		if err == io.EOF {
			return lines, nil
		}
	}
}
