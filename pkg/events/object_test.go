package events

import (
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestEnvelopeRows checks what envelope's shared rows assume: the struct of
// an event with an envelope starts with ID and TS, as eventHead does (the
// table test below checks each event's rows against its own fields).
func TestEnvelopeRows(t *testing.T) {
	t.Parallel()
	rows := envelope()
	require.Len(t, rows, 3)
	require.Equal(t, unsafe.Offsetof(Decision{}.ID), rows[1].off)
	require.Equal(t, unsafe.Offsetof(Decision{}.TS), rows[2].off)
}

// TestObjectTablesMatchTheirStructs checks every row of every table against
// its Go field: the offset of the row (the generator's, or envelope's) points
// at the field of the member's name and kind (a row pointing elsewhere would
// decode into the wrong bytes).
func TestObjectTablesMatchTheirStructs(t *testing.T) {
	t.Parallel()
	kinds := map[propKind]reflect.Kind{
		pString: reflect.String, pEnum: reflect.String, pTime: reflect.Struct, pIP: reflect.Struct,
		pBool: reflect.Bool, pInt64: reflect.Int64, pInt32: reflect.Int32, pFloat: reflect.Float64,
		pStruct: reflect.Struct, pStructPtr: reflect.Pointer, pList: reflect.Slice,
	}
	for typ, table := range map[reflect.Type]*object{
		reflect.TypeFor[Decision](): &objDecision, reflect.TypeFor[Abuse](): &objAbuse,
		reflect.TypeFor[Adjustment](): &objAdjustment, reflect.TypeFor[Deferred](): &objDeferred,
		reflect.TypeFor[RulesVersion](): &objRulesVersion,
	} {
		checkTable(t, typ, table, kinds)
	}
}

func checkTable(t *testing.T, typ reflect.Type, table *object, kinds map[propKind]reflect.Kind) {
	t.Helper()
	byOffset := map[uintptr]reflect.StructField{}
	for i := range typ.NumField() {
		byOffset[typ.Field(i).Offset] = typ.Field(i)
	}
	for _, f := range table.props {
		if f.kind == pConst {
			continue
		}
		field, ok := byOffset[f.off]
		require.True(t, ok, "%s.%s: no field at offset %d", typ.Name(), f.name, f.off)
		require.True(t, strings.EqualFold(strings.ReplaceAll(f.name, "_", ""), field.Name), "%s.%s is at %s", typ.Name(), f.name, field.Name)
		require.Equal(t, kinds[f.kind], field.Type.Kind(), "%s.%s is %s", typ.Name(), f.name, field.Name)
		switch f.kind {
		case pStruct:
			checkTable(t, field.Type, f.obj, kinds)
		case pStructPtr, pList:
			checkTable(t, field.Type.Elem(), f.obj, kinds)
		}
	}
}

// TestObjectNeedIsItsRequiredMembers checks object.need, the required
// members' bits the decoder compares with the members it read, against the
// rows' required flags.
func TestObjectNeedIsItsRequiredMembers(t *testing.T) {
	t.Parallel()
	for _, table := range []*object{&objDecision, &objAbuse, &objAdjustment, &objDeferred, &objRulesVersion, &objPrincipal, &objWindow} {
		var need uint32
		for i, f := range table.props {
			if f.required {
				need |= 1 << i
			}
		}
		require.Equal(t, need, table.need, table.path)
	}
}
