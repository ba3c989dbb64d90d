package dynamo

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"
)

func TestStrAndNum(t *testing.T) {
	tests := []struct {
		name     string
		v        types.AttributeValue
		str, num string
	}{
		{"string", &types.AttributeValueMemberS{Value: "a"}, "a", ""},
		{"number", &types.AttributeValueMemberN{Value: "42"}, "", "42"},
		{"other kind", &types.AttributeValueMemberBOOL{Value: true}, "", ""},
		{"missing", nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.str, Str(tt.v))
			require.Equal(t, tt.num, Num(tt.v))
		})
	}
}
