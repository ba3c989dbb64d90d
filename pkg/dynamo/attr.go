package dynamo

import "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

// Str is the value of a string attribute, "" when v is missing or not a string.
func Str(v types.AttributeValue) string {
	if s, ok := v.(*types.AttributeValueMemberS); ok {
		return s.Value
	}
	return ""
}

// Num is the text of a number attribute, "" when v is missing or not a number.
func Num(v types.AttributeValue) string {
	if n, ok := v.(*types.AttributeValueMemberN); ok {
		return n.Value
	}
	return ""
}
