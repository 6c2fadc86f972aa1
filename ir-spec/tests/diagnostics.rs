//! Snapshot tests of parse errors: each case is a small wrong program, rendered exactly as a user
//! sees it. Snapshots live in `snapshots/diagnostics/` at the repository root; refresh them with
//! `INSTA_UPDATE=always cargo test -p sinter-ir --test diagnostics` and review every change.

use sinter_ir::text::parse;

/// Parses `src` (which must fail) and snapshots its rendered diagnostics under `name`.
fn check(name: &str, src: &str) {
    let rendered = match parse(src) {
        Ok(g) => panic!(
            "`{name}` parsed without errors:\n{}",
            sinter_ir::text::print(&g)
        ),
        Err(diags) => diags.render("test.sir", src),
    };
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../snapshots/diagnostics"
    ));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_description(src);
    settings.bind(|| insta::assert_snapshot!(name, rendered));
}

// Lexer errors.

#[test]
fn lexer_unexpected_character() {
    check(
        "lexer_unexpected_character",
        "graph g {\n  input x: f32[2]\n  y = mul(x, x) @ 2\n}\n",
    );
}

#[test]
fn lexer_non_ascii_name() {
    check(
        "lexer_non_ascii_name",
        "graph g {\n  input x: f32[2]\n  poids_é = relu(x)\n}\n",
    );
}

#[test]
fn lexer_unterminated_string() {
    check(
        "lexer_unterminated_string",
        "graph g {\n  input x: f32[2]\n  y = cast(x, dtype=\"i32)\n}\n",
    );
}

#[test]
fn lexer_bad_escape() {
    check(
        "lexer_bad_escape",
        "graph g {\n  input x: f32[2]\n  y = cast(x, dtype=\"i\\32\")\n}\n",
    );
}

#[test]
fn lexer_malformed_number() {
    check(
        "lexer_malformed_number",
        "graph g {\n  input x: f32[2]\n  y = mul(x, 1.5.2)\n}\n",
    );
}

// Syntax errors.

#[test]
fn syntax_missing_paren() {
    check(
        "syntax_missing_paren",
        "graph g {\n  input x: f32[2]\n  h = relu(exp(x)\n  y = sigmoid(h)\n  output y\n}\n",
    );
}

#[test]
fn syntax_missing_equals() {
    check(
        "syntax_missing_equals",
        "graph g {\n  input x: f32[2]\n  y relu(x)\n}\n",
    );
}

#[test]
fn syntax_unnamed_call() {
    check(
        "syntax_unnamed_call",
        "graph g {\n  input x: f32[2]\n  relu(x)\n}\n",
    );
}

#[test]
fn syntax_bad_type() {
    check("syntax_bad_type", "graph g {\n  input x: f32(2, 3)\n}\n");
}

#[test]
fn syntax_unknown_dtype() {
    check(
        "syntax_unknown_dtype",
        "graph g {\n  input x: f64[2, 3]\n}\n",
    );
}

#[test]
fn syntax_zero_extent() {
    check(
        "syntax_zero_extent",
        "graph g {\n  input x: f32[64, 0]\n}\n",
    );
}

#[test]
fn syntax_graph_not_closed() {
    check(
        "syntax_graph_not_closed",
        "graph g {\n  input x: f32[2]\n  y = relu(x)\n",
    );
}

#[test]
fn syntax_second_graph() {
    check(
        "syntax_second_graph",
        "graph g {\n  input x: f32[2]\n}\ngraph h {\n}\n",
    );
}

#[test]
fn syntax_operand_after_attribute() {
    check(
        "syntax_operand_after_attribute",
        "graph g {\n  input x: f32[2, 3]\n  y = softmax(axis=0, x)\n}\n",
    );
}

#[test]
fn syntax_keyword_as_name() {
    check(
        "syntax_keyword_as_name",
        "graph g {\n  input x: f32[2]\n  output = relu(x)\n}\n",
    );
}

#[test]
fn syntax_negated_name() {
    check(
        "syntax_negated_name",
        "graph g {\n  input x: f32[2]\n  y = add(x, -x)\n}\n",
    );
}

#[test]
fn syntax_bare_dtype_attribute() {
    check(
        "syntax_bare_dtype_attribute",
        "graph g {\n  input x: f32[2]\n  y = cast(x, dtype=i32)\n}\n",
    );
}

#[test]
fn syntax_int_overflow() {
    check(
        "syntax_int_overflow",
        "graph g {\n  input x: f32[8]\n  y = slice(x, axis=0, start=0, end=99999999999999999999)\n}\n",
    );
}

#[test]
fn syntax_alias() {
    check("syntax_alias", "graph g {\n  input x: f32[2]\n  y = x\n}\n");
}

// Names.

#[test]
fn unknown_op() {
    check(
        "unknown_op",
        "graph g {\n  input x: f32[2]\n  y = rleu(x)\n}\n",
    );
}

#[test]
fn unknown_name() {
    check(
        "unknown_name",
        "graph g {\n  input hidden: f32[2]\n  y = relu(hiden)\n}\n",
    );
}

#[test]
fn use_before_definition() {
    check(
        "use_before_definition",
        "graph g {\n  input x: f32[2]\n  y = add(x, z)\n  z = exp(x)\n}\n",
    );
}

#[test]
fn redefinition() {
    check(
        "redefinition",
        "graph g {\n  input x: f32[2]\n  h = relu(x)\n  h = exp(h)\n}\n",
    );
}

#[test]
fn output_undefined() {
    check(
        "output_undefined",
        "graph g {\n  input x: f32[2]\n  accuracy = mean(x)\n  output accurracy\n}\n",
    );
}

// Operands and types.

#[test]
fn wrong_operand_count() {
    check(
        "wrong_operand_count",
        "graph g {\n  input x: f32[2]\n  y = add(x)\n}\n",
    );
}

#[test]
fn wrong_dtype() {
    check(
        "wrong_dtype",
        "graph g {\n  input ids: i32[4]\n  y = relu(ids)\n}\n",
    );
}

#[test]
fn literal_compared_with_int() {
    check(
        "literal_compared_with_int",
        "graph g {\n  input ids: i32[4]\n  y = eq(ids, 1)\n}\n",
    );
}

#[test]
fn broadcast_failure() {
    check(
        "broadcast_failure",
        "graph g {\n  input a: f32[2, 3]\n  input b: f32[4]\n  y = add(a, b)\n}\n",
    );
}

#[test]
fn matmul_inner_mismatch() {
    check(
        "matmul_inner_mismatch",
        "graph g {\n  input x: f32[64, 784]\n  param w: f32[748, 128] = zeros\n  h = matmul(x, w)\n}\n",
    );
}

#[test]
fn nested_multi_result_call() {
    check(
        "nested_multi_result_call",
        "graph g {\n  param w: f32[2] = zeros\n  param b: f32[2] = zeros\n  loss = sum(mul(w, b))\n  y = relu(grad(loss, w, b))\n}\n",
    );
}

// Attributes.

#[test]
fn unknown_attribute() {
    check(
        "unknown_attribute",
        "graph g {\n  input x: f32[2, 3]\n  y = softmax(x, axs=1)\n}\n",
    );
}

#[test]
fn missing_attribute() {
    check(
        "missing_attribute",
        "graph g {\n  input x: f32[2, 3]\n  y = reshape(x)\n}\n",
    );
}

#[test]
fn bad_attribute_kind() {
    check(
        "bad_attribute_kind",
        "graph g {\n  input x: f32[2, 3]\n  y = softmax(x, axis=1.5)\n}\n",
    );
}

#[test]
fn bad_attribute_string() {
    check(
        "bad_attribute_string",
        "graph g {\n  input x: f32[2, 3]\n  y = gelu(x, approximate=\"fast\")\n}\n",
    );
}

#[test]
fn duplicate_attribute() {
    check(
        "duplicate_attribute",
        "graph g {\n  input x: f32[2, 3]\n  y = softmax(x, axis=0, axis=1)\n}\n",
    );
}

#[test]
fn axis_out_of_range() {
    check(
        "axis_out_of_range",
        "graph g {\n  input x: f32[2, 3]\n  y = softmax(x, axis=2)\n}\n",
    );
}

#[test]
fn reshape_mismatch() {
    check(
        "reshape_mismatch",
        "graph g {\n  input x: f32[4, 6]\n  y = reshape(x, shape=[5, 5])\n}\n",
    );
}

#[test]
fn permute_not_a_permutation() {
    check(
        "permute_not_a_permutation",
        "graph g {\n  input x: f32[2, 3, 4]\n  y = permute(x, perm=[0, 0, 1])\n}\n",
    );
}

#[test]
fn slice_out_of_range() {
    check(
        "slice_out_of_range",
        "graph g {\n  input x: f32[2, 5]\n  y = slice(x, axis=1, start=0, end=9)\n}\n",
    );
}

#[test]
fn squeeze_non_unit_axis() {
    check(
        "squeeze_non_unit_axis",
        "graph g {\n  input x: f32[2, 5]\n  y = squeeze(x, axis=0)\n}\n",
    );
}

// Neural-network ops.

#[test]
fn conv2d_channel_mismatch() {
    check(
        "conv2d_channel_mismatch",
        "graph g {\n  input x: f32[1, 3, 8, 8]\n  param w: f32[16, 4, 3, 3] = normal(std=0.1)\n  y = conv2d(x, w, padding=1)\n}\n",
    );
}

#[test]
fn group_norm_groups_do_not_divide() {
    check(
        "group_norm_groups_do_not_divide",
        "graph g {\n  input x: f32[2, 6, 4, 4]\n  param gamma: f32[6] = ones\n  param beta: f32[6] = zeros\n  y = group_norm(x, gamma, beta, groups=4)\n}\n",
    );
}

#[test]
fn cross_entropy_label_shape() {
    check(
        "cross_entropy_label_shape",
        "graph g {\n  input logits: f32[8, 10]\n  input labels: i32[4]\n  loss = cross_entropy(logits, labels)\n}\n",
    );
}

#[test]
fn attention_mask_shape() {
    check(
        "attention_mask_shape",
        "graph g {\n  input q: f32[1, 2, 4, 8]\n  input k: f32[1, 2, 4, 8]\n  input v: f32[1, 2, 4, 8]\n  input mask: f32[3, 4]\n  o = attention(q, k, v, mask, causal=true)\n}\n",
    );
}

#[test]
fn attention_kv_heads_not_dividing() {
    check(
        "attention_kv_heads_not_dividing",
        "graph g {\n  input q: f32[1, 6, 4, 8]\n  input k: f32[1, 4, 4, 8]\n  input v: f32[1, 4, 4, 8]\n  o = attention(q, k, v)\n}\n",
    );
}

#[test]
fn sgd_momentum_without_buffer() {
    check(
        "sgd_momentum_without_buffer",
        "graph g {\n  param w: f32[2] = zeros\n  input dw: f32[2]\n  w2 = sgd(w, dw, lr=0.1, momentum=0.9)\n}\n",
    );
}

// Gradients and results.

#[test]
fn grad_of_non_scalar() {
    check(
        "grad_of_non_scalar",
        "graph g {\n  input x: f32[4, 3]\n  param w: f32[3, 2] = zeros\n  h = matmul(x, w)\n  dw = grad(h, w)\n}\n",
    );
}

#[test]
fn grad_wrt_computed() {
    check(
        "grad_wrt_computed",
        "graph g {\n  input x: f32[4, 3]\n  param w: f32[3, 2] = zeros\n  h = matmul(x, w)\n  loss = sum(h)\n  dh = grad(loss, h)\n}\n",
    );
}

#[test]
fn result_count_mismatch() {
    check(
        "result_count_mismatch",
        "graph g {\n  param w1: f32[2] = zeros\n  param w2: f32[2] = zeros\n  loss = sum(mul(w1, w2))\n  dw = grad(loss, w1, w2)\n}\n",
    );
}

// Assignments.

#[test]
fn assign_to_input() {
    check(
        "assign_to_input",
        "graph g {\n  input x: f32[2]\n  y = relu(x)\n  assign x = y\n}\n",
    );
}

#[test]
fn assign_type_mismatch() {
    check(
        "assign_type_mismatch",
        "graph g {\n  param w: f32[3, 2] = zeros\n  s = sum(w)\n  assign w = s\n}\n",
    );
}

#[test]
fn assign_twice() {
    check(
        "assign_twice",
        "graph g {\n  state step: f32[] = zeros\n  next = add(step, 1)\n  assign step = next\n  assign step = step\n}\n",
    );
}

// Initializers.

#[test]
fn unknown_initializer() {
    check(
        "unknown_initializer",
        "graph g {\n  param w: f32[2] = normel(std=0.1)\n}\n",
    );
}

#[test]
fn initializer_unknown_argument() {
    check(
        "initializer_unknown_argument",
        "graph g {\n  param w: f32[2] = normal(sd=0.1)\n}\n",
    );
}

#[test]
fn initializer_negative_std() {
    check(
        "initializer_negative_std",
        "graph g {\n  param w: f32[2] = normal(std=-0.1, seed=3)\n}\n",
    );
}

#[test]
fn initializer_empty_range() {
    check(
        "initializer_empty_range",
        "graph g {\n  param w: f32[2] = uniform(lo=1, hi=-1)\n}\n",
    );
}

#[test]
fn initializer_negative_seed() {
    check(
        "initializer_negative_seed",
        "graph g {\n  param w: f32[2] = normal(std=0.1, seed=-1)\n}\n",
    );
}

#[test]
fn param_without_initializer() {
    check(
        "param_without_initializer",
        "graph g {\n  param w: f32[784, 128]\n}\n",
    );
}

#[test]
fn input_with_initializer() {
    check(
        "input_with_initializer",
        "graph g {\n  input x: f32[2] = zeros\n}\n",
    );
}

// Recovery.

#[test]
fn multiple_errors() {
    check(
        "multiple_errors",
        "\
graph g {
  input x: f32[4, 3]
  input labels: i32[4]
  param w: f32[3, 5] = normal(std=0.1, seed=1)
  h = matmul(x, w
  a = relu(h)                # h is poisoned: no second error
  logits = add(a, bias)      # a is poisoned too
  z = softmx(x, axis=1)
  p = reshape(x, shape=[5])
  loss = cross_entropy(logits, labels)
  output loss, p, z, nothing
}
",
    );
}

#[test]
fn independent_errors_in_one_statement() {
    check(
        "independent_errors_in_one_statement",
        "graph g {\n  input x: f32[2]\n  y = add(relux(x), undefined_name)\n}\n",
    );
}

#[test]
fn result_named_twice() {
    check(
        "result_named_twice",
        "graph g {\n  param w1: f32[2] = zeros\n  param w2: f32[2] = zeros\n  loss = sum(mul(w1, w2))\n  d, d = grad(loss, w1, w2)\n}\n",
    );
}

#[test]
fn missing_paren_before_attribute_line() {
    check(
        "missing_paren_before_attribute_line",
        "graph g {\n  input x: f32[2, 3]\n  y = softmax(x,\n  z = relu(x)\n  output z\n}\n",
    );
}

#[test]
fn empty_file() {
    check("empty_file", "");
}

#[test]
fn statements_outside_graph() {
    check("statements_outside_graph", "input x: f32[2]\ny = relu(x)\n");
}

// The `train` statement.

#[test]
fn train_unknown_optimizer() {
    check(
        "train_unknown_optimizer",
        "graph g {\n  param w: f32[2] = zeros\n  loss = sum(square(w))\n  train loss with adamm(lr=0.01)\n}\n",
    );
}

#[test]
fn train_unknown_attribute() {
    check(
        "train_unknown_attribute",
        "graph g {\n  param w: f32[2] = zeros\n  loss = sum(square(w))\n  train loss with adamw(lr=0.01, clip=1.0)\n}\n",
    );
}

#[test]
fn train_bad_attribute_value() {
    check(
        "train_bad_attribute_value",
        "graph g {\n  param w: f32[2] = zeros\n  loss = sum(square(w))\n  train loss with adam(lr=0.01, beta2=1.5)\n}\n",
    );
}

#[test]
fn train_missing_loss() {
    check(
        "train_missing_loss",
        "graph g {\n  param w: f32[2] = zeros\n  loss = sum(square(w))\n  train with sgd(lr=0.1)\n}\n",
    );
}

#[test]
fn train_undefined_loss() {
    check(
        "train_undefined_loss",
        "graph g {\n  param w: f32[2] = zeros\n  total_loss = sum(square(w))\n  train loss with sgd(lr=0.1)\n}\n",
    );
}

#[test]
fn train_twice() {
    check(
        "train_twice",
        "graph g {\n  param w: f32[2] = zeros\n  param b: f32[2] = zeros\n  loss = sum(square(add(w, b)))\n  train loss with adamw(params=[w])\n  train loss with sgd(lr=0.1, params=[b])\n}\n",
    );
}

#[test]
fn train_name_taken() {
    check(
        "train_name_taken",
        "graph g {\n  param w: f32[2] = zeros\n  state w.m: f32[2] = zeros\n  loss = sum(square(w))\n  train loss with adamw()\n}\n",
    );
}

#[test]
fn train_not_a_param() {
    check(
        "train_not_a_param",
        "graph g {\n  input x: f32[2]\n  param w: f32[2] = zeros\n  loss = sum(mul(x, w))\n  train loss with adamw(params=[w, x])\n}\n",
    );
}
