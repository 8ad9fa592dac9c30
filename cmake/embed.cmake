# embed.cmake - turns the text file IN into a C file OUT defining
#   const char sdpa__default_rules_text[] = { ..., 0 };
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}" "/* Generated from default.rules by cmake/embed.cmake. Do not edit. */\n"
     "const char sdpa__default_rules_text[] = {\n${bytes}0x00};\n")
