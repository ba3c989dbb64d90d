package quotatest

import (
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
)

type typesAV = types.AttributeValue

func strAV(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

// avN is a number attribute as an int64, 0 when missing or not a whole number.
func avN(v types.AttributeValue) int64 {
	i, _ := strconv.ParseInt(dynamo.Num(v), 10, 64)
	return i
}
